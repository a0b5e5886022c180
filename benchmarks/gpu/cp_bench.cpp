// Context-parallel attention on all visible GPUs over NCCL (one rank thread per GPU, dist::launch with
// Backend::nccl): forward + backward, causal, bf16, bshd with b = 1, h = 16, d = 128, at equal tokens
// per GPU (16k and 64k), for p2p, all_gather, a2a and, on 4 GPUs, a2a+p2p (2 x 2). Ends with the table
// whose header starts "CP summary".
//
//   NCCL_NVLS_ENABLE=0 ./gpu_cp_bench [--ranks N] [--tokens 16384,65536] [--strategies
//   p2p,p2p:1,all_gather,a2a,a2a+p2p] (p2p:1 = the ring forward on one compute stream, for comparison with the default
//   two; a2a:G and a2a+p2p:G = G head groups in the pipelined all-to-all, a2a:1 = not pipelined; plain = automatic)
//                                     [--max-call-seconds 30] [--thd-tokens 65536] [--thd-only] [--thd-plan]
//                                     [--thd-profile N]
// After the bshd table, the packed-documents case (cp_bench_thd.h; --thd-tokens 0 skips it) prints the
// table whose header starts "CP packed documents". --thd-only skips the bshd table; --thd-plan prints the
// packed-documents case's attention calls as cuDNN sees them (cp_bench_thd_plan.h) and exits, without a GPU;
// --thd-profile N adds N profiled calls per packed-documents case and prints where their time goes (cp_bench_thd.h).
//
// Efficiency (ring-flash-attention's convention, "theoretic flash_attn" = one GPU's rate / world size):
// with n GPUs and T tokens per GPU the CP run computes one causal attention over S = n T tokens. Its
// FLOPs are F(S) = 3.5 x 2 b h S^2 (d_qk + d_v) / 2 (forward 2 b h S^2 (d_qk + d_v), halved for causal;
// backward 2.5 x forward, as gpu_attention_bench counts them). The dual-chunk layout gives every rank
// exactly F(S) / n: rank r's query chunks r and 2n-1-r see r + 1/2 and 2n-1-r + 1/2 chunks of keys,
// 2n chunk-pairs for every rank. "The same per-GPU work on one GPU" is therefore F(S) / n done at the
// rate one GPU reaches on that causal attention, measured by running the whole S-token problem on
// cuda:0 (time t1):
//   per-GPU TFLOP/s = F(S) / n / t_cp          1-GPU TFLOP/s = F(S) / t1
//   efficiency      = per-GPU / 1-GPU = t1 / (n t_cp)      (target >= 90% for p2p)
// A causal attention over only T tokens is not that work: it has a larger share of diagonal tiles (and a
// lower rate), which would flatter the CP run. Peak memory per rank is the caching allocator's peak during
// the timed calls, inputs and gradients included; "model GiB/rank" is what docs/cp.md's memory formulas give for
// the same case (attention/cp/memory_model.h), "1-GPU model GiB" the same for one GPU on the whole sequence.
//
// Timing: a warm-up call (plans, NCCL connections, allocator cache), a second call that sizes the
// batches (`reps` calls, about 0.5 s), then 5 batches, each between a barrier and a device
// synchronisation; the median batch, the slowest rank's. A case whose
// warm-up call takes longer than --max-call-seconds (a slow fallback) is reported, not timed.
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
#include "attention/cp/memory_model.h"
#include "attention/dot_product_attention.h"
#include "benchmarks/gpu/cp_bench_common.h"
#include "benchmarks/gpu/cp_bench_thd.h"
#include "benchmarks/gpu/cp_bench_thd_plan.h"
#include "framework/autograd/ops.h"
#include "framework/distributed/device_mesh.h"
#include "framework/distributed/launcher.h"
#include "framework/distributed/nccl/nccl_init.h"
#include "framework/tensor/cuda/cuda.h"
#include "framework/tensor/random.h"

namespace {

using namespace cpf;
using cp::CommType;
using namespace cpf::bench;  // Clock, median, seconds_since, reps_for, split_list (cp_bench_common.h)

constexpr int64_t kHeads = 16, kHeadDim = 128;
constexpr int kBatches = 5;

double flops_fwd_bwd(int64_t seq) {  // causal, b = 1
  return 3.5 * 2.0 * kHeads * static_cast<double>(seq) * static_cast<double>(seq) * (2 * kHeadDim) / 2;
}

struct Row {
  int64_t tokens_per_gpu = 0;
  std::string strategy;
  std::string note;  // why it was not measured; empty when it was
  double seconds = 0;
  double bytes_sent = 0;              // per rank per call (forward + backward), the largest over ranks
  double peak_max = 0, peak_min = 0;  // bytes, over ranks
};

struct Baseline {
  std::string note;
  double seconds = 0;
  double peak = 0;
};

AttentionSpec causal() {
  AttentionSpec spec;
  spec.qkv_format = QkvFormat::bshd;
  spec.mask = MaskType::causal;
  spec.window = {-1, 0};
  return spec;
}

// The whole S-token problem on cuda:0: dot_product_attention forward + backward from out.
Baseline single_gpu(int64_t seq, double max_call_seconds) {
  Baseline b;
  try {
    Generator gen(7);
    const TensorOptions opts{.dtype = DType::bf16, .device = Device::cuda(0)};
    Tensor q = uniform({1, seq, kHeads, kHeadDim}, -1, 1, opts, &gen).set_requires_grad();
    Tensor k = uniform({1, seq, kHeads, kHeadDim}, -1, 1, opts, &gen).set_requires_grad();
    Tensor v = uniform({1, seq, kHeads, kHeadDim}, -1, 1, opts, &gen).set_requires_grad();
    const Tensor dout = uniform({1, seq, kHeads, kHeadDim}, -1, 1, opts, &gen);
    auto call = [&] {
      auto [out, lse] = dot_product_attention(q, k, v, causal());
      backward({out}, {dout});
      q.set_grad(Tensor());
      k.set_grad(Tensor());
      v.set_grad(Tensor());
    };
    cuda::reset_peak_memory_stats(0);
    const auto t0 = Clock::now();
    call();
    cuda::synchronize(0);
    const double warm = seconds_since(t0);
    if (warm > max_call_seconds) {
      b.note = "one call took " + std::to_string(warm) + " s";
    } else {
      const auto t1 = Clock::now();  // a second call, without the first one's plan building, sizes the batches
      call();
      cuda::synchronize(0);
      const int reps = reps_for(seconds_since(t1));
      std::vector<double> batches;
      for (int i = 0; i < kBatches; ++i) {
        const auto t = Clock::now();
        for (int r = 0; r < reps; ++r) call();
        cuda::synchronize(0);
        batches.push_back(seconds_since(t) / reps);
      }
      b.seconds = median(batches);
      b.peak = static_cast<double>(cuda::memory_stats(0).peak_allocated);
    }
  } catch (const Error& e) {
    b.note = e.message();
  } catch (const std::exception& e) {
    b.note = e.what();
  }
  cuda::synchronize(0);
  cuda::empty_cache(0);
  return b;
}

// The largest (or smallest) of every rank's value.
double over_ranks(dist::RankContext& ctx, double mine, dist::ReduceOp op) {
  const Tensor t = full({1}, mine, {.dtype = DType::f64, .device = ctx.device});
  return ctx.world->all_reduce(t, op).item<double>();
}

// The slowest rank's median over kBatches batches of seconds per call; a second call, without the
// first one's plan building, sizes the batches.
double seconds_per_call(dist::RankContext& ctx, const std::function<void()>& call) {
  const int dev = ctx.device.index;
  ctx.world->barrier();
  const auto t1 = Clock::now();
  call();
  cuda::synchronize(dev);
  const int reps = reps_for(over_ranks(ctx, seconds_since(t1), dist::ReduceOp::max));
  std::vector<double> batches;
  for (int i = 0; i < kBatches; ++i) {
    ctx.world->barrier();
    const auto t = Clock::now();
    for (int r = 0; r < reps; ++r) call();
    cuda::synchronize(dev);
    batches.push_back(seconds_since(t) / reps);
  }
  return over_ranks(ctx, median(batches), dist::ReduceOp::max);
}

Row run_cp(int n, int64_t tokens, CommType comm, int streams, int head_groups, const std::string& name,
           double max_call_seconds) {
  Row row;
  row.tokens_per_gpu = tokens;
  row.strategy = name;
  std::mutex mutex;
  try {
    dist::launch(n,
                 [&](dist::RankContext& ctx) {
                   dist::MeshShape shape{.cp = n, .require_cp = true};
                   if (comm == CommType::a2a_p2p) {
                     shape.cp_a2a = 2;
                     shape.hierarchical_cp = true;
                   }
                   dist::DeviceMesh mesh(ctx.world, shape);
                   cp::ContextParallel cp_config{comm, mesh.cp(), mesh.cp_a2a(), mesh.cp_p2p(), {}, streams};
                   cp_config.a2a_head_groups = head_groups;
                   const int dev = ctx.device.index;
                   Generator gen(100 + static_cast<uint64_t>(ctx.rank));
                   const TensorOptions opts{.dtype = DType::bf16, .device = ctx.device};
                   Tensor q = uniform({1, tokens, kHeads, kHeadDim}, -1, 1, opts, &gen).set_requires_grad();
                   Tensor k = uniform({1, tokens, kHeads, kHeadDim}, -1, 1, opts, &gen).set_requires_grad();
                   Tensor v = uniform({1, tokens, kHeads, kHeadDim}, -1, 1, opts, &gen).set_requires_grad();
                   const Tensor dout = uniform({1, tokens, kHeads, kHeadDim}, -1, 1, opts, &gen);
                   auto call = [&](const std::shared_ptr<cp::CpStats>& stats) {
                     auto [out, lse] = cp::context_parallel_attention(
                         cp::dual_chunk_of(q, cp_config), cp::dual_chunk_of(k, cp_config),
                         cp::dual_chunk_of(v, cp_config), causal(), std::nullopt, cp_config, stats);
                     backward({out}, {dout});
                     q.set_grad(Tensor());
                     k.set_grad(Tensor());
                     v.set_grad(Tensor());
                   };
                   cuda::reset_peak_memory_stats(dev);
                   auto stats = std::make_shared<cp::CpStats>();
                   ctx.world->barrier();
                   const auto t0 = Clock::now();
                   call(stats);
                   cuda::synchronize(dev);
                   // Every rank takes the same decisions from the slowest warm-up.
                   const double warm = over_ranks(ctx, seconds_since(t0), dist::ReduceOp::max);
                   const double sent =
                       over_ranks(ctx, static_cast<double>(stats->forward_bytes_sent + stats->backward_bytes_sent),
                                  dist::ReduceOp::max);
                   if (warm > max_call_seconds) {
                     std::lock_guard lock(mutex);
                     row.note = "one call took " + std::to_string(warm) + " s";
                     return;
                   }
                   const double seconds = seconds_per_call(ctx, [&] { call(nullptr); });
                   const double peak = static_cast<double>(cuda::memory_stats(dev).peak_allocated);
                   const double peak_max = over_ranks(ctx, peak, dist::ReduceOp::max);
                   const double peak_min = over_ranks(ctx, peak, dist::ReduceOp::min);
                   if (ctx.rank == 0) {
                     std::lock_guard lock(mutex);
                     row.seconds = seconds;
                     row.bytes_sent = sent;
                     row.peak_max = peak_max;
                     row.peak_min = peak_min;
                   }
                 },
                 {.timeout = std::chrono::seconds(600), .backend = dist::Backend::nccl});
  } catch (const Error& e) {
    row.note = e.message();
  } catch (const std::exception& e) {
    row.note = e.what();
  }
  for (int d = 0; d < n; ++d) cuda::empty_cache(d);
  return row;
}

double gib(double bytes) { return bytes / 1073741824.0; }

std::string fixed(const char* format, double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, value);
  return buf;
}

// The per-rank peak of docs/cp.md's memory formulas for a row (attention/cp/memory_model.h), next to
// the measured one; "n/a" where the model refuses the case. ranks = 0: one GPU on the whole sequence.
std::string model_gib(const std::string& strategy, int64_t tokens_per_gpu, int ranks) {
  const cp::CpMemoryShape shape{.tokens_per_rank = tokens_per_gpu,
                                .cp = ranks,
                                .a2a = 2,
                                .heads = kHeads,
                                .kv_heads = kHeads,
                                .head_dim_qk = kHeadDim,
                                .head_dim_v = kHeadDim,
                                .device = DeviceType::cuda};
  try {
    const int64_t bytes =
        strategy.empty()
            ? cp::single_device_memory_estimate(shape).peak_bytes()
            : cp::cp_memory_estimate(cp::parse_comm_type(strategy.substr(0, strategy.find(':'))), shape).peak_bytes();
    return fixed("%.2f", gib(static_cast<double>(bytes)));
  } catch (const Error&) {
    return "n/a";
  }
}

}  // namespace

int main(int argc, char** argv) {
  CpBenchArgs args;
  args.strategies = {"p2p", "p2p:1", "all_gather", "a2a", "a2a:1", "a2a+p2p"};
  args.max_call_seconds = 30;
  parse_cp_bench_args(argc, argv, args);
  const bench::thd::Args thd = bench::thd::parse_args(argc, argv);
  if (thd.plan) return bench::thd::print_plan(args.ranks, thd.tokens);  // host logic only: runs without a GPU
  if (!enough_gpus("gpu_cp_bench", args.ranks)) return 0;
  const int ranks = args.ranks;
  const double max_call_seconds = args.max_call_seconds;
  std::printf("gpu_cp_bench: %d ranks (one per GPU), NCCL %d, causal bf16 b=1 h=%lld d=%lld, NCCL_NVLS_ENABLE=%s\n",
              ranks, dist::nccl::nccl_version(), static_cast<long long>(kHeads), static_cast<long long>(kHeadDim),
              std::getenv("NCCL_NVLS_ENABLE") ? std::getenv("NCCL_NVLS_ENABLE") : "(unset)");
  std::vector<Row> rows;
  std::vector<Baseline> baselines;
  for (const int64_t t : thd.only ? std::vector<int64_t>{} : args.tokens) {
    const int64_t seq = t * ranks;
    const Baseline base = single_gpu(seq, max_call_seconds);
    const std::string base_text =
        base.note.empty()
            ? fixed("%.2f ms, ", base.seconds * 1e3) + fixed("%.1f TFLOP/s", flops_fwd_bwd(seq) / base.seconds * 1e-12)
            : base.note;
    std::printf("1 GPU, %lld tokens: %s\n", static_cast<long long>(seq), base_text.c_str());
    std::fflush(stdout);
    for (const std::string& name : args.strategies) {
      // "p2p:1": the ring forward on one compute stream instead of two alternating ones; "a2a:G": G head groups.
      const size_t colon = name.find(':');
      const CommType comm = cp::parse_comm_type(name.substr(0, colon));
      const int suffix = colon == std::string::npos ? 0 : std::stoi(name.substr(colon + 1));
      const bool ulysses = comm == CommType::a2a || comm == CommType::a2a_p2p;
      const int streams = ulysses || suffix == 0 ? 2 : suffix;
      const int head_groups = ulysses ? suffix : 0;
      if (comm == CommType::a2a_p2p && (ranks % 2 != 0 || ranks < 4)) continue;  // needs a2a 2 x p2p >= 2
      if ((comm == CommType::a2a || comm == CommType::a2a_p2p) && kHeads % (comm == CommType::a2a ? ranks : 2) != 0) {
        continue;
      }
      Row row = run_cp(ranks, t, comm, streams, head_groups, name, max_call_seconds);
      const std::string row_text = row.note.empty() ? fixed("%.2f ms per call", row.seconds * 1e3) : row.note;
      std::printf("%d GPUs, %lld tokens per GPU, %s: %s\n", ranks, static_cast<long long>(t), name.c_str(),
                  row_text.c_str());
      std::fflush(stdout);
      rows.push_back(row);
      baselines.push_back(base);
    }
  }

  std::printf(
      "\nCP summary (%d GPUs over NCCL; fwd+bwd, causal, bf16, b=1 h=%lld d=%lld; efficiency = per-GPU "
      "TFLOP/s / one GPU's TFLOP/s on the whole sequence = t1 / (n t_cp); target >= 90%% for p2p)\n",
      ranks, static_cast<long long>(kHeads), static_cast<long long>(kHeadDim));
  std::printf("%-10s | %-10s | %-10s | %-13s | %-13s | %-10s | %-14s | %-23s | %-14s | %-14s | %s\n", "tokens/GPU",
              "strategy", "ms/call", "per-GPU TF/s", "1-GPU TF/s", "efficiency", "sent MiB/rank",
              "peak GiB/rank (max / min)", "1-GPU peak GiB", "model GiB/rank", "1-GPU model GiB");
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const Baseline& b = baselines[i];
    const int64_t seq = r.tokens_per_gpu * ranks;
    const double per_gpu = r.note.empty() ? flops_fwd_bwd(seq) / ranks / r.seconds * 1e-12 : 0;
    const double one = b.note.empty() ? flops_fwd_bwd(seq) / b.seconds * 1e-12 : 0;
    char eff[32] = "n/a";
    if (per_gpu > 0 && one > 0) std::snprintf(eff, sizeof eff, "%.1f%%", 100 * per_gpu / one);
    if (!r.note.empty()) {
      std::printf("%-10lld | %-10s | not measured: %s\n", static_cast<long long>(r.tokens_per_gpu), r.strategy.c_str(),
                  r.note.substr(0, 160).c_str());
      continue;
    }
    const std::string one_text = b.note.empty() ? fixed("%.1f", one) : "n/a (" + b.note.substr(0, 60) + ")";
    const std::string peaks = fixed("%.2f", gib(r.peak_max)) + " / " + fixed("%.2f", gib(r.peak_min));
    std::printf("%-10lld | %-10s | %-10.2f | %-13.1f | %-13s | %-10s | %-14.1f | %-23s | %-14s | %-14s | %s\n",
                static_cast<long long>(r.tokens_per_gpu), r.strategy.c_str(), r.seconds * 1e3, per_gpu,
                one_text.c_str(), eff, r.bytes_sent / 1048576.0, peaks.c_str(),
                b.note.empty() ? fixed("%.2f", gib(b.peak)).c_str() : "n/a",
                model_gib(r.strategy, r.tokens_per_gpu, ranks).c_str(), model_gib("", r.tokens_per_gpu, ranks).c_str());
  }
  // The packed-documents case (cp_bench_thd.h), after the bshd table.
  if (thd.tokens > 0) bench::thd::run(ranks, thd.tokens, args.strategies, max_call_seconds, thd.profile_calls);
  return 0;
}
