// CPU time of each CP strategy for one fixed global problem (b = 1, s = 2048, 8 heads, d = 64,
// causal), forward and forward + backward, at cp = 2 and 4 thread ranks, against one rank without
// CP; and the fraction of ring steps / tiles a sliding window lets p2p skip.
//
//   build/cpu/benchmarks/cpu_cp_bench --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
//
// Thread ranks share the machine's cores, so these are costs (total work plus communication), not
// the scaling a multi-GPU run shows.
#include <benchmark/benchmark.h>

#include <mutex>

#include "attention/cp/context_parallel.h"
#include "attention/cp/sharding.h"
#include "framework/autograd/ops.h"
#include "framework/distributed/device_mesh.h"
#include "framework/distributed/launcher.h"
#include "framework/tensor/ops/copy.h"

namespace {

using namespace cpf;

constexpr int64_t kSeq = 2048, kHeads = 8, kDim = 64;

struct Problem {
  Tensor q, k, v, dout;
};

const Problem& problem() {
  static const Problem p = [] {
    Generator gen(3);
    const Shape shape{1, kSeq, kHeads, kDim};
    return Problem{randn(shape, {}, &gen), randn(shape, {}, &gen), randn(shape, {}, &gen), randn(shape, {}, &gen)};
  }();
  return p;
}

AttentionSpec spec(int64_t window_left) {
  return {.qkv_format = QkvFormat::bshd, .mask = MaskType::causal, .window = {window_left, 0}};
}

// One forward (and backward) on `cp` thread ranks; returns rank 0's stats.
cp::CpStats run(cp::CommType comm, int cp_size, bool with_backward, int64_t window_left) {
  cp::CpStats stats0;
  std::mutex mutex;
  dist::launch(cp_size, [&](dist::RankContext& rc) {
    dist::MeshShape shape{.cp = cp_size, .require_cp = true};
    if (comm == cp::CommType::a2a_p2p) {
      shape.cp_a2a = 2;
      shape.hierarchical_cp = true;
    }
    dist::DeviceMesh mesh(rc.world, shape);
    const Problem& p = problem();
    Tensor q = cp::shard_sequence(p.q, 1, cp_size, rc.rank), k = cp::shard_sequence(p.k, 1, cp_size, rc.rank),
           v = cp::shard_sequence(p.v, 1, cp_size, rc.rank);
    if (with_backward) {
      q.set_requires_grad();
      k.set_requires_grad();
      v.set_requires_grad();
    }
    auto stats = std::make_shared<cp::CpStats>();
    auto result = cp::context_parallel_attention(cp::dual_chunk_of(q, {comm, mesh.cp(), mesh.cp_a2a(), mesh.cp_p2p()}),
                                                 cp::dual_chunk_of(k, {comm, mesh.cp(), mesh.cp_a2a(), mesh.cp_p2p()}),
                                                 cp::dual_chunk_of(v, {comm, mesh.cp(), mesh.cp_a2a(), mesh.cp_p2p()}),
                                                 spec(window_left), std::nullopt,
                                                 {comm, mesh.cp(), mesh.cp_a2a(), mesh.cp_p2p()}, stats);
    if (with_backward) backward(result.out, cp::shard_sequence(p.dout, 1, cp_size, rc.rank));
    if (rc.rank == 0) {
      std::lock_guard<std::mutex> lock(mutex);
      stats0 = *stats;
    }
  });
  return stats0;
}

void BM_SingleRank(benchmark::State& state) {
  const bool with_backward = state.range(0) != 0;
  const Problem& p = problem();
  for (auto _ : state) {
    Tensor q = p.q.detach(), k = p.k.detach(), v = p.v.detach();
    if (with_backward) {
      q = raw::clone(p.q).set_requires_grad();
      k = raw::clone(p.k).set_requires_grad();
      v = raw::clone(p.v).set_requires_grad();
    }
    auto result = dot_product_attention(q, k, v, spec(-1));
    if (with_backward) backward(result.out, p.dout);
    benchmark::DoNotOptimize(result.out.raw_data());
  }
  state.SetLabel(with_backward ? "fwd+bwd" : "fwd");
}
BENCHMARK(BM_SingleRank)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_ContextParallel(benchmark::State& state) {
  const auto comm = static_cast<cp::CommType>(state.range(0));
  const int cp_size = static_cast<int>(state.range(1));
  const bool with_backward = state.range(2) != 0;
  cp::CpStats stats;
  for (auto _ : state) stats = run(comm, cp_size, with_backward, -1);
  state.SetLabel(cp::comm_type_name(comm) + " cp=" + std::to_string(cp_size) + (with_backward ? " fwd+bwd" : " fwd"));
  state.counters["MB_sent_rank0"] =
      static_cast<double>(stats.forward_bytes_sent + stats.backward_bytes_sent) / (1 << 20);
}
BENCHMARK(BM_ContextParallel)
    ->ArgsProduct({{0, 1, 2}, {2, 4}, {0, 1}})
    ->Args({3, 4, 0})
    ->Args({3, 4, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_SlidingWindowRing(benchmark::State& state) {
  const int64_t window = state.range(0);
  cp::CpStats stats;
  for (auto _ : state) stats = run(cp::CommType::p2p, 4, false, window);
  const TileStats& t = stats.forward_tiles;
  state.counters["ring_steps_skipped_pct"] = 100.0 * static_cast<double>(stats.ring_steps_skipped) /
                                             static_cast<double>(std::max<int64_t>(stats.ring_steps, 1));
  const double all_tiles = static_cast<double>(t.full + t.partial + t.skipped);
  state.counters["tiles_skipped_pct"] = all_tiles > 0 ? 100.0 * static_cast<double>(t.skipped) / all_tiles : 0.0;
  state.SetLabel("p2p cp=4 causal window left=" + std::to_string(window) + " (rank 0)");
}
BENCHMARK(BM_SlidingWindowRing)->Arg(128)->Arg(512)->Arg(-1)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
