// MLA latent-KV communication on all visible GPUs over NCCL (one rank thread per GPU): a
// DeepSeek-V2-Lite-like layer (h = 16, d_qk = 192 = 128 + 64 RoPE, d_v = 128, kv_lora_rank = 512),
// causal bf16 bshd b = 1, forward + backward at equal tokens per GPU (16k and 64k), p2p and all_gather,
// each with the latent travelling (cp::context_parallel_mla_attention) and with the expanded K/V
// travelling (the same expansion as autograd ops, then cp::context_parallel_attention). Ends with the
// table whose header starts "MLA latent summary".
//
//   NCCL_NVLS_ENABLE=0 ./gpu_cp_mla_latent_bench [--ranks N] [--tokens 16384,65536]
//                                                [--strategies p2p,all_gather] [--max-call-seconds 60]
//
// Every call includes the expansion (c_kv W^T per token on the rank that uses the block) and its
// backward, so both paths do the same module-level work. Bytes are what the rank sent per call (CpStats,
// forward + backward), the largest over ranks. Efficiency as gpu_cp_bench: the whole S = n T token
// problem on cuda:0 (expansion + attention, time t1) against n GPUs (time t_cp): t1 / (n t_cp).
// Timing: a warm-up call, a sizing call, then 5 batches between barriers; the median batch, the
// slowest rank's.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "attention/cp/context_parallel.h"
#include "attention/cuda/backend_selection.h"
#include "attention/dot_product_attention.h"
#include "benchmarks/gpu/cp_bench_common.h"
#include "framework/autograd/functions/linear.h"
#include "framework/autograd/ops.h"
#include "framework/distributed/device_mesh.h"
#include "framework/distributed/launcher.h"
#include "framework/tensor/cuda/cuda.h"
#include "framework/tensor/random.h"

namespace {

using namespace cpf;
using cp::CommType;
using namespace cpf::bench;  // Clock, median, seconds_since, reps_for, split_list (cp_bench_common.h)

const cp::MlaLatentShape kShape{
    .num_heads = 16, .kv_lora_rank = 512, .qk_nope_head_dim = 128, .qk_rope_head_dim = 64, .v_head_dim = 128};
constexpr int kBatches = 5;

double attention_flops(int64_t seq) {  // causal fwd + bwd, b = 1 (gpu_cp_bench's convention)
  return 3.5 * 2.0 * kShape.num_heads * static_cast<double>(seq) * static_cast<double>(seq) *
         static_cast<double>(kShape.head_dim_qk() + kShape.v_head_dim) / 2;
}

AttentionSpec causal() {
  AttentionSpec spec;
  spec.mask = MaskType::causal;
  spec.window = {-1, 0};
  return spec;
}

// The module's inputs of T tokens on `device`: q, the latent, the up-projection, the output gradient.
struct Inputs {
  Tensor q, latent, weight, dout;
};

Inputs make_inputs(int64_t tokens, const Device& device, uint64_t seed) {
  Generator gen(seed);
  const TensorOptions opts{.dtype = DType::bf16, .device = device};
  const int64_t rows = kShape.num_heads * (kShape.qk_nope_head_dim + kShape.v_head_dim);
  return {uniform({1, tokens, kShape.num_heads, kShape.head_dim_qk()}, -1, 1, opts, &gen).set_requires_grad(),
          uniform({1, tokens, 1, kShape.latent_dim()}, -1, 1, opts, &gen).set_requires_grad(),
          uniform({rows, kShape.kv_lora_rank}, -0.05, 0.05, opts, &gen).set_requires_grad(),
          uniform({1, tokens, kShape.num_heads, kShape.v_head_dim}, -1, 1, opts, &gen)};
}

// K and V from the latent with autograd ops (what the module does without latent communication): the
// up-projection is a `linear`, one (T, rank) x (rank, H (nope + d_v)) GEMM each way, as the module's
// kv_b_proj. (A `matmul` of the (1, T, 1, rank) latent with W^T treats (1, T) as batch dims, and its
// backward formed dW per token before summing them: a (T, rank, H (nope + d_v)) bf16 tensor, 64 GiB at
// 16k tokens and the 256 GiB request at 64k of the first run, which were taken for unfused attention.)
std::pair<Tensor, Tensor> expand_kv(const Tensor& latent, const Tensor& weight) {
  const std::vector<Tensor> parts =
      split(latent, std::vector<int64_t>{kShape.kv_lora_rank, kShape.qk_rope_head_dim}, -1);
  Tensor kv = linear(parts[0], weight);  // (1, T, 1, H (nope + d_v))
  kv = reshape(kv, {1, latent.size(1), kShape.num_heads, kShape.qk_nope_head_dim + kShape.v_head_dim});
  const std::vector<Tensor> kv_parts = split(kv, std::vector<int64_t>{kShape.qk_nope_head_dim, kShape.v_head_dim}, -1);
  const Tensor k_pe = expand(parts[1], {1, latent.size(1), kShape.num_heads, kShape.qk_rope_head_dim});
  return {cat({kv_parts[0], k_pe}, -1), kv_parts[1]};
}

void clear_grads(Inputs& in) {
  in.q.set_grad(Tensor());
  in.latent.set_grad(Tensor());
  in.weight.set_grad(Tensor());
}

// Times `call` (returns nothing) on `dev` for this rank; the slowest rank's median, or a note.
template <class Call, class Max>
std::pair<double, std::string> time_calls(Call&& call, int dev, double max_call_seconds, Max&& over_ranks_max,
                                          const std::function<void()>& barrier) {
  barrier();
  const auto t0 = Clock::now();
  call();
  cuda::synchronize(dev);
  const double warm = over_ranks_max(seconds_since(t0));
  if (warm > max_call_seconds) return {0, "one call took " + std::to_string(warm) + " s"};
  barrier();
  const auto t1 = Clock::now();
  call();
  cuda::synchronize(dev);
  const int reps = reps_for(over_ranks_max(seconds_since(t1)));
  std::vector<double> batches;
  for (int i = 0; i < kBatches; ++i) {
    barrier();
    const auto t = Clock::now();
    for (int r = 0; r < reps; ++r) call();
    cuda::synchronize(dev);
    batches.push_back(seconds_since(t) / reps);
  }
  return {over_ranks_max(median(batches)), ""};
}

struct Row {
  int64_t tokens_per_gpu = 0;
  std::string strategy, path, note;
  double seconds = 0, bytes_sent = 0, peak = 0;
};

// The whole S-token problem on cuda:0: expansion + dot_product_attention, forward + backward.
std::pair<double, std::string> single_gpu(int64_t seq, double max_call_seconds) {
  try {
    Inputs in = make_inputs(seq, Device::cuda(0), 7);
    {
      // Which kernels the reference runs (cuDNN expected: bshd, causal, d_qk 192 / d_v 128, bf16).
      const auto [k, v] = expand_kv(in.latent, in.weight);
      const AttentionProblem p = check_attention_inputs(in.q, k, v, causal(), std::nullopt, {});
      std::printf("1 GPU, %lld tokens: attention forward %s, backward %s\n", static_cast<long long>(seq),
                  attention_cuda::describe_selection(p, DType::bf16, false, false).c_str(),
                  attention_cuda::describe_selection(p, DType::bf16, true, false).c_str());
    }
    auto call = [&] {
      const auto [k, v] = expand_kv(in.latent, in.weight);
      auto [out, lse] = dot_product_attention(in.q, k, v, causal());
      backward({out}, {in.dout});
      clear_grads(in);
    };
    auto result = time_calls(
        call, 0, max_call_seconds, [](double x) { return x; }, [] {});
    cuda::synchronize(0);
    cuda::empty_cache(0);
    return result;
  } catch (const std::exception& e) {
    cuda::empty_cache(0);
    return {0, e.what()};
  }
}

Row run_cp(int n, int64_t tokens, CommType comm, bool latent, double max_call_seconds) {
  Row row{tokens, cp::comm_type_name(comm), latent ? "latent" : "expanded K/V", "", 0, 0, 0};
  std::mutex mutex;
  try {
    dist::launch(n,
                 [&](dist::RankContext& ctx) {
                   dist::DeviceMesh mesh(ctx.world, {.cp = n, .require_cp = true});
                   const cp::ContextParallel cp_config{comm, mesh.cp()};
                   const int dev = ctx.device.index;
                   Inputs in = make_inputs(tokens, ctx.device, 100 + static_cast<uint64_t>(ctx.rank));
                   auto stats = std::make_shared<cp::CpStats>();
                   auto call = [&] {
                     *stats = cp::CpStats{};
                     AttentionOutput o;
                     if (latent) {
                       o = cp::context_parallel_mla_attention(
                           cp::dual_chunk_of(in.q, cp_config), cp::dual_chunk_of(in.latent, cp_config), in.weight,
                           Tensor(), kShape, causal(), std::nullopt, cp_config, stats);
                     } else {
                       const auto [k, v] = expand_kv(in.latent, in.weight);
                       o = cp::context_parallel_attention(
                           cp::dual_chunk_of(in.q, cp_config), cp::dual_chunk_of(k, cp_config),
                           cp::dual_chunk_of(v, cp_config), causal(), std::nullopt, cp_config, stats);
                     }
                     backward({o.out}, {in.dout});
                     clear_grads(in);
                   };
                   auto max_over_ranks = [&](double mine) {
                     const Tensor t = full({1}, mine, {.dtype = DType::f64, .device = ctx.device});
                     return ctx.world->all_reduce(t, dist::ReduceOp::max).item<double>();
                   };
                   cuda::reset_peak_memory_stats(dev);
                   const auto [seconds, note] =
                       time_calls(call, dev, max_call_seconds, max_over_ranks, [&] { ctx.world->barrier(); });
                   const double sent =
                       max_over_ranks(static_cast<double>(stats->forward_bytes_sent + stats->backward_bytes_sent));
                   const double peak = max_over_ranks(static_cast<double>(cuda::memory_stats(dev).peak_allocated));
                   if (ctx.rank == 0) {
                     std::lock_guard lock(mutex);
                     row.seconds = seconds;
                     row.note = note;
                     row.bytes_sent = sent;
                     row.peak = peak;
                   }
                 },
                 {.timeout = std::chrono::seconds(600), .backend = dist::Backend::nccl});
  } catch (const std::exception& e) {
    row.note = e.what();
  }
  for (int d = 0; d < n; ++d) cuda::empty_cache(d);
  return row;
}

void print_summary(int ranks, const std::vector<Row>& rows, const std::vector<std::pair<double, std::string>>& bases) {
  std::printf(
      "\nMLA latent summary (%d GPUs over NCCL; fwd+bwd incl. the K/V expansion, causal bf16, h=%lld "
      "d_qk=%lld d_v=%lld kv_lora_rank=%lld; efficiency = t1 / (n t_cp))\n",
      ranks, static_cast<long long>(kShape.num_heads), static_cast<long long>(kShape.head_dim_qk()),
      static_cast<long long>(kShape.v_head_dim), static_cast<long long>(kShape.kv_lora_rank));
  std::printf("%-10s | %-10s | %-12s | %-10s | %-10s | %-14s | %s\n", "tokens/GPU", "strategy", "travels", "ms/call",
              "efficiency", "sent MiB/rank", "peak GiB/rank");
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    if (!r.note.empty()) {
      std::printf("%-10lld | %-10s | %-12s | not measured: %s\n", static_cast<long long>(r.tokens_per_gpu),
                  r.strategy.c_str(), r.path.c_str(), r.note.substr(0, 160).c_str());
      continue;
    }
    char eff[32] = "n/a";
    if (bases[i].second.empty()) std::snprintf(eff, sizeof eff, "%.1f%%", 100 * bases[i].first / (ranks * r.seconds));
    std::printf("%-10lld | %-10s | %-12s | %-10.2f | %-10s | %-14.1f | %.2f\n",
                static_cast<long long>(r.tokens_per_gpu), r.strategy.c_str(), r.path.c_str(), r.seconds * 1e3, eff,
                r.bytes_sent / 1048576.0, r.peak / 1073741824.0);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CpBenchArgs args;
  args.strategies = {"p2p", "all_gather"};
  args.max_call_seconds = 60;
  parse_cp_bench_args(argc, argv, args);
  if (!enough_gpus("gpu_cp_mla_latent_bench", args.ranks)) return 0;
  const int ranks = args.ranks;
  const double max_call_seconds = args.max_call_seconds;
  std::vector<Row> rows;
  std::vector<std::pair<double, std::string>> bases;
  for (const int64_t t : args.tokens) {
    const auto base = single_gpu(t * ranks, max_call_seconds);
    std::printf("1 GPU, %lld tokens: %s\n", static_cast<long long>(t * ranks),
                base.second.empty() ? (std::to_string(base.first * 1e3) + " ms, " +
                                       std::to_string(attention_flops(t * ranks) / base.first * 1e-12) + " TFLOP/s")
                                          .c_str()
                                    : base.second.c_str());
    std::fflush(stdout);
    for (const std::string& name : args.strategies) {
      for (const bool latent : {false, true}) {
        Row row = run_cp(ranks, t, cp::parse_comm_type(name), latent, max_call_seconds);
        std::printf("%d GPUs, %lld tokens per GPU, %s, %s: %s\n", ranks, static_cast<long long>(t), name.c_str(),
                    row.path.c_str(),
                    row.note.empty() ? (std::to_string(row.seconds * 1e3) + " ms").c_str() : row.note.c_str());
        std::fflush(stdout);
        rows.push_back(row);
        bases.push_back(base);
      }
    }
  }
  print_summary(ranks, rows, bases);
  return 0;
}
