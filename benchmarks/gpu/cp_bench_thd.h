#pragma once
// gpu_cp_bench's packed-documents case (thd): documents of long-tailed lengths (cp::packed_document_lengths:
// lognormal, median 1024, clipped to [128, 32768], seed 1234) packed into n x T real tokens, each
// padded to a multiple of 2n (cp::pad_cu_seqlens), causal within each document (padding_causal), bf16,
// h = 16, d = 128. Per strategy: fwd+bwd ms, the efficiency against one GPU running the whole packed
// batch (t1 / (n t_cp), as the bshd rows), and the work imbalance between ranks: max / mean of each
// rank's causal (query, key) pairs, computed from the sharding (cp::causal_pairs_per_rank), which is
// the slowdown the slowest rank imposes on a perfectly overlapped run.
//
// --thd-profile N (gpu_cp_bench) then runs N more calls of each case with profile scopes recording
// (framework/tensor/profile.h: host and GPU time per scope, every rank thread timing its own device) and
// prints the table as the case ends (before its row): where a call's time goes (cp/* steps, attention/* checks, cuDNN
// kernels and fix-ups). Times are summed over the ranks and the N calls.
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "attention/cp/context_parallel.h"
#include "attention/cp/sharding.h"
#include "attention/cp/work_balance.h"
#include "attention/dot_product_attention.h"
#include "benchmarks/gpu/cp_bench_common.h"
#include "framework/autograd/ops.h"
#include "framework/distributed/device_mesh.h"
#include "framework/distributed/launcher.h"
#include "framework/tensor/cuda/cuda.h"
#include "framework/tensor/profile.h"
#include "framework/tensor/random.h"

namespace cpf::bench::thd {

constexpr int64_t kHeads = 16, kHeadDim = 128;
constexpr uint64_t kSeed = 1234;

// gpu_cp_bench's flags for this case: --thd-tokens T (0 skips it), --thd-only (no bshd table), --thd-plan
// (cp_bench_thd_plan.h, no GPU) and --thd-profile N.
struct Args {
  int64_t tokens = 65536;
  bool only = false, plan = false;
  int profile_calls = 0;
};

inline Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--thd-tokens" && i + 1 < argc) a.tokens = std::atoll(argv[i + 1]);
    if (flag == "--thd-profile" && i + 1 < argc) a.profile_calls = std::atoi(argv[i + 1]);
    a.only = a.only || flag == "--thd-only";
    a.plan = a.plan || flag == "--thd-plan";
  }
  return a;
}

struct Batch {
  std::vector<int64_t> cu, cu_padded;
  int64_t documents = 0;
};

inline Batch make_batch(int ranks, int64_t tokens_per_gpu) {
  Batch b;
  b.cu = {0};
  for (int64_t len : cp::packed_document_lengths(ranks * tokens_per_gpu, kSeed)) b.cu.push_back(b.cu.back() + len);
  b.cu_padded = cp::pad_cu_seqlens(b.cu, ranks);
  b.documents = static_cast<int64_t>(b.cu.size()) - 1;
  return b;
}

inline AttentionSpec spec() {
  AttentionSpec s;
  s.qkv_format = QkvFormat::thd;
  s.mask = MaskType::padding_causal;
  s.window = {-1, 0};
  return s;
}

// Times `call` (warm-up, sizing call, kBatches batches between barriers; the median, the slowest rank's);
// `barrier` and `slowest` are no-ops / identity on one GPU. Returns seconds, or a note in `note`.
template <class Call, class Barrier, class Slowest>
double time_call(Call&& call, Barrier&& barrier, Slowest&& slowest, int device, double max_call_seconds,
                 std::string& note) {
  barrier();
  const auto t0 = Clock::now();
  call();
  cuda::synchronize(device);
  const double warm = slowest(seconds_since(t0));
  if (warm > max_call_seconds) {
    note = "one call took " + std::to_string(warm) + " s";
    return 0;
  }
  barrier();
  const auto t1 = Clock::now();
  call();
  cuda::synchronize(device);
  const int reps = reps_for(slowest(seconds_since(t1)));
  std::vector<double> batches;
  for (int i = 0; i < 5; ++i) {
    barrier();
    const auto t = Clock::now();
    for (int r = 0; r < reps; ++r) call();
    cuda::synchronize(device);
    batches.push_back(seconds_since(t) / reps);
  }
  return slowest(median(batches));
}

// A call's forward and backward under their own profile scopes (thd/forward, thd/backward), so that
// --thd-profile splits the call; outside profiling they cost an NVTX range each.
template <class F>
auto forward_scope(F&& f) {
  const profile::Scope scope("thd/forward");
  return f();
}
template <class F>
void backward_scope(F&& f) {
  const profile::Scope scope("thd/backward");
  f();
}

// Runs `calls` profiled calls of `call` on this rank's device (profile.h); `barrier` separates the
// ranks' recording from the timed calls. Rank 0 (`first`) resets the table before and prints it after,
// under `title`. Nothing when calls is 0.
template <class Call, class Barrier>
void profiled_calls(Call&& call, Barrier&& barrier, Device device, bool first, int calls, const std::string& title) {
  if (calls <= 0) return;
  barrier();
  if (first) {
    profile::reset();
    profile::set_enabled(true);
  }
  barrier();
  {
    const profile::DeviceScope timed_device(device);  // Scope("name") in library code times this device
    for (int i = 0; i < calls; ++i) {
      const profile::Scope scope("thd/call");
      call();
    }
    cuda::synchronize(device.index);
  }
  barrier();
  if (first) {
    profile::set_enabled(false);
    std::printf("\nprofile of %s (%d calls per rank, summed over the ranks):\n%s", title.c_str(), calls,
                profile::format_table(profile::snapshot()).c_str());
    std::fflush(stdout);
  }
  barrier();
}

// q, k, v (requires grad) and dout of `tokens` thd tokens on `device`.
struct Inputs {
  Tensor q, k, v, dout;
  Inputs(int64_t tokens, Device device, uint64_t seed) {
    Generator gen(seed);
    const TensorOptions opts{.dtype = DType::bf16, .device = device};
    q = uniform({tokens, kHeads, kHeadDim}, -1, 1, opts, &gen).set_requires_grad();
    k = uniform({tokens, kHeads, kHeadDim}, -1, 1, opts, &gen).set_requires_grad();
    v = uniform({tokens, kHeads, kHeadDim}, -1, 1, opts, &gen).set_requires_grad();
    dout = uniform({tokens, kHeads, kHeadDim}, -1, 1, opts, &gen);
  }
  void clear_grads() {
    q.set_grad(Tensor());
    k.set_grad(Tensor());
    v.set_grad(Tensor());
  }
};

// The whole packed batch on cuda:0.
inline double single_gpu(const Batch& b, double max_call_seconds, int profile_calls, std::string& note) {
  double seconds = 0;
  try {
    Inputs in(b.cu_padded.back(), Device::cuda(0), 7);
    const SequenceInfo seq = SequenceInfo::from_cu_seqlens(b.cu, b.cu_padded);
    auto call = [&] {
      const Tensor out = forward_scope([&] { return dot_product_attention(in.q, in.k, in.v, spec(), seq).out; });
      backward_scope([&] { backward({out}, {in.dout}); });
      in.clear_grads();
    };
    seconds = time_call(
        call, [] {}, [](double s) { return s; }, 0, max_call_seconds, note);
    if (note.empty())
      profiled_calls(
          call, [] {}, Device::cuda(0), true, profile_calls, "1 GPU");
  } catch (const std::exception& e) {
    note = e.what();
  }
  cuda::synchronize(0);
  cuda::empty_cache(0);
  return seconds;
}

// One strategy over `ranks` GPUs: every rank holds its dual chunks of every document. `head_groups` is
// ContextParallel::a2a_head_groups (a2a, a2a+p2p).
inline double multi_gpu(const Batch& b, int ranks, cp::CommType comm, int head_groups, double max_call_seconds,
                        int profile_calls, std::string& note) {
  double seconds = 0;
  std::mutex mutex;
  try {
    dist::launch(ranks,
                 [&](dist::RankContext& ctx) {
                   dist::MeshShape shape{.cp = ranks, .require_cp = true};
                   if (comm == cp::CommType::a2a_p2p) {
                     shape.cp_a2a = 2;
                     shape.hierarchical_cp = true;
                   }
                   dist::DeviceMesh mesh(ctx.world, shape);
                   cp::ContextParallel config{comm, mesh.cp(), mesh.cp_a2a(), mesh.cp_p2p()};
                   config.a2a_head_groups = head_groups;
                   Inputs in(b.cu_padded.back() / ranks, ctx.device, 100 + static_cast<uint64_t>(ctx.rank));
                   const SequenceInfo seq = SequenceInfo::from_cu_seqlens(b.cu, b.cu_padded);  // global
                   auto call = [&] {
                     const Tensor out = forward_scope([&] {
                       return cp::context_parallel_attention(cp::dual_chunk_of(in.q, config),
                                                             cp::dual_chunk_of(in.k, config),
                                                             cp::dual_chunk_of(in.v, config), spec(), seq, config)
                           .out;
                     });
                     backward_scope([&] { backward({out}, {in.dout}); });
                     in.clear_grads();
                   };
                   auto slowest = [&](double s) {
                     const Tensor t = full({1}, s, {.dtype = DType::f64, .device = ctx.device});
                     return ctx.world->all_reduce(t, dist::ReduceOp::max).item<double>();
                   };
                   std::string rank_note;
                   const double s = time_call(
                       call, [&] { ctx.world->barrier(); }, slowest, ctx.device.index, max_call_seconds, rank_note);
                   if (rank_note.empty()) {
                     profiled_calls(
                         call, [&] { ctx.world->barrier(); }, ctx.device, ctx.rank == 0, profile_calls,
                         std::string(cp::comm_type_name(comm)) + " on " + std::to_string(ranks) + " GPUs");
                   }
                   if (ctx.rank == 0) {
                     std::lock_guard lock(mutex);
                     seconds = s;
                     note = rank_note;
                   }
                 },
                 {.timeout = std::chrono::seconds(600), .backend = dist::Backend::nccl});
  } catch (const std::exception& e) {
    note = e.what();
  }
  for (int d = 0; d < ranks; ++d) cuda::empty_cache(d);
  return seconds;
}

// Runs the case for every strategy name ("a2a:1" = one head group, i.e. not pipelined) and prints its
// table, whose header starts "CP packed documents".
inline void run(int ranks, int64_t tokens_per_gpu, const std::vector<std::string>& strategies, double max_call_seconds,
                int profile_calls = 0) {
  const Batch b = make_batch(ranks, tokens_per_gpu);
  std::string base_note;
  const double t1 = single_gpu(b, max_call_seconds, profile_calls, base_note);
  std::printf(
      "\nCP packed documents (thd, padding_causal, bf16, h=%lld d=%lld): %lld documents, %lld real tokens "
      "(%lld tokens/GPU), lognormal lengths median 1024 in [128, 32768], seed %llu; 1 GPU: %s\n",
      static_cast<long long>(kHeads), static_cast<long long>(kHeadDim), static_cast<long long>(b.documents),
      static_cast<long long>(b.cu.back()), static_cast<long long>(tokens_per_gpu),
      static_cast<unsigned long long>(kSeed),
      base_note.empty() ? (std::to_string(static_cast<int64_t>(t1 * 1e6) / 1e3) + " ms").c_str() : base_note.c_str());
  std::printf("%-10s | %-10s | %-10s | %-10s | %s\n", "tokens/GPU", "strategy", "ms/call", "efficiency",
              "work imbalance (max/mean)");
  for (const std::string& name : strategies) {
    const size_t colon = name.find(':');
    const cp::CommType comm = cp::parse_comm_type(name.substr(0, colon));
    if (comm == cp::CommType::a2a_p2p && (ranks % 2 != 0 || ranks < 4)) continue;
    if (comm == cp::CommType::a2a && kHeads % ranks != 0) continue;
    const bool ulysses = comm == cp::CommType::a2a || comm == cp::CommType::a2a_p2p;
    const int groups = ulysses && colon != std::string::npos ? std::stoi(name.substr(colon + 1)) : 0;
    if (!ulysses && colon != std::string::npos) continue;  // p2p:1 (streams) is a bshd-table variant
    const double imbalance = cp::work_imbalance(
        cp::causal_pairs_per_rank(b.cu, b.cu_padded, comm, ranks, comm == cp::CommType::a2a_p2p ? 2 : 1));
    std::string note;
    const double t = multi_gpu(b, ranks, comm, groups, max_call_seconds, profile_calls, note);
    char eff[32] = "n/a";
    if (note.empty() && base_note.empty() && t > 0) std::snprintf(eff, sizeof eff, "%.1f%%", 100 * t1 / (ranks * t));
    char ms[32];
    std::snprintf(ms, sizeof ms, "%.2f", t * 1e3);
    const std::string time = note.empty() ? std::string(ms) : "not measured: " + note.substr(0, 120);
    std::printf("%-10lld | %-10s | %-10s | %-10s | %.3f\n", static_cast<long long>(tokens_per_gpu), name.c_str(),
                time.c_str(), eff, imbalance);
    std::fflush(stdout);
  }
}

}  // namespace cpf::bench::thd
