// Thread-backend collective bandwidth: all_reduce, all_gather and all_to_all of f32 tensors of
// 1-64 MiB on 2 and 4 ranks (threads of this process). Results: docs/distributed.md.
//
//   build/dist-bench/benchmarks/distributed_bench --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
//
// The benchmark thread is rank 0; ranks 1..n-1 are helper threads that run one collective each
// time rank 0 starts one, so one iteration is one complete collective (rank 0 returns only after
// every rank finished its part). Counters follow nccl-tests: size S = the all_reduce input, the
// all_gather output, the all_to_all input (per rank); algbw = S / time; busbw = algbw * 2(n-1)/n
// for all_reduce and algbw * (n-1)/n for the others, comparable across rank counts. BM_memcpy, one
// thread copying S bytes, is the roof measured under the same conditions. BM_data_parallel_step: a
// data-parallel training step with the gradient all-reduce after backward or overlapped with it.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "framework/autograd/engine.h"
#include "framework/autograd/ops.h"
#include "framework/distributed/autograd_collectives.h"
#include "framework/distributed/grad_reducer.h"
#include "framework/distributed/thread/thread_process_group.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/random.h"

namespace {

using cpf::Tensor;
using cpf::dist::ProcessGroup;

enum class Op { all_reduce, all_gather, all_to_all };

constexpr int64_t kMiB = 1 << 20;

// One collective on `pg` with this rank's preallocated tensors.
void run_op(Op op, ProcessGroup& pg, const Tensor& input, const Tensor& out) {
  switch (op) {
    case Op::all_reduce: pg.all_reduce_async(input, cpf::dist::ReduceOp::sum, out)->wait(); break;
    case Op::all_gather: pg.all_gather_async(input, 0, out)->wait(); break;
    case Op::all_to_all: pg.all_to_all_async(input, 0, 1, out)->wait(); break;
  }
}

// n thread ranks of one world, rank 0 on the benchmark thread and ranks 1..n-1 on helper threads
// that run their step once each time rank 0 starts one (step()), so one iteration is one complete
// collective step. The cores are shared evenly between the ranks' progress threads, as dist::launch does.
class LockstepRanks {
 public:
  using Step = std::function<void()>;
  // make_step(r, group) runs on rank r's helper thread (its setup may be collective) and returns its step.
  LockstepRanks(int n, const std::function<Step(int, const cpf::dist::ProcessGroupPtr&)>& make_step) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    world_ = cpf::dist::thread::ThreadWorld::create(n, {.omp_threads_per_rank = std::max(1, cores / n)});
    for (int r = 0; r < n; ++r) groups_.push_back(world_->group(r));
    for (int r = 1; r < n; ++r) {
      helpers_.emplace_back([this, r, make_step, group = groups_[static_cast<size_t>(r)]] {
        const Step step = make_step(r, group);
        for (int64_t done = 0;; ++done) {
          {
            std::unique_lock lock(mutex_);
            cv_.wait(lock, [&] { return started_ > done || stop_; });
            if (started_ == done) return;  // stopped, and every started step has run
          }
          step();
        }
      });
    }
  }
  ~LockstepRanks() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : helpers_) t.join();
  }
  const cpf::dist::ProcessGroupPtr& group(int rank) const { return groups_[static_cast<size_t>(rank)]; }
  // Starts one step on every helper and runs rank 0's.
  void step(const Step& rank0) {
    {
      std::lock_guard lock(mutex_);
      ++started_;
    }
    cv_.notify_all();
    rank0();
  }

 private:
  std::shared_ptr<cpf::dist::thread::ThreadWorld> world_;
  std::vector<cpf::dist::ProcessGroupPtr> groups_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int64_t started_ = 0;
  bool stop_ = false;
  std::vector<std::thread> helpers_;
};

void BM_collective(benchmark::State& state, Op op) {
  const int n = static_cast<int>(state.range(0));
  const int64_t bytes = state.range(1) * kMiB;
  const int64_t floats = bytes / 4;
  // Shapes: all_gather input is S/n so its output is S; all_to_all (n*64, -1) split on dim 0.
  const int64_t rows = 64 * n;
  std::vector<Tensor> inputs, outputs;
  for (int r = 0; r < n; ++r) {
    switch (op) {
      case Op::all_reduce:
        inputs.push_back(cpf::full({floats}, r));
        outputs.push_back(cpf::empty({floats}));
        break;
      case Op::all_gather:
        inputs.push_back(cpf::full({floats / n}, r));
        outputs.push_back(cpf::empty({floats}));
        break;
      case Op::all_to_all:
        inputs.push_back(cpf::full({rows, floats / rows}, r));
        outputs.push_back(cpf::empty({rows / n, n * (floats / rows)}));
        break;
    }
  }
  {
    LockstepRanks ranks(n, [&](int r, const cpf::dist::ProcessGroupPtr& group) -> LockstepRanks::Step {
      return [&, r, group] { run_op(op, *group, inputs[static_cast<size_t>(r)], outputs[static_cast<size_t>(r)]); };
    });
    const auto one_collective = [&] { ranks.step([&] { run_op(op, *ranks.group(0), inputs[0], outputs[0]); }); };
    one_collective();  // warm-up: first touch of the outputs, progress threads started
    for (auto _ : state) one_collective();
  }

  const double factor = op == Op::all_reduce ? 2.0 * (n - 1) / n : static_cast<double>(n - 1) / n;
  // Bytes per second, printed with SI prefixes ("12.3G/s" = 12.3 GB/s).
  const auto rate = benchmark::Counter::kIsIterationInvariantRate;
  state.counters["algbw"] = benchmark::Counter(static_cast<double>(bytes), rate, benchmark::Counter::kIs1000);
  state.counters["busbw"] = benchmark::Counter(static_cast<double>(bytes) * factor, rate, benchmark::Counter::kIs1000);
}

// The roof on the same machine at the same time: one thread copying S bytes (algbw = S / time).
void BM_memcpy(benchmark::State& state) {
  const int64_t bytes = state.range(0) * kMiB;
  std::vector<char> src(static_cast<size_t>(bytes), 1), dst(static_cast<size_t>(bytes), 0);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), static_cast<size_t>(bytes));
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.counters["algbw"] = benchmark::Counter(
      static_cast<double>(bytes), benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

void sizes(benchmark::internal::Benchmark* b) {
  for (int n : {2, 4}) {
    for (int mib : {1, 4, 16, 64}) b->Args({n, mib});
  }
  b->ArgNames({"ranks", "MiB"})->UseRealTime()->Unit(benchmark::kMicrosecond);
}

BENCHMARK(BM_memcpy)->Arg(1)->Arg(4)->Arg(16)->Arg(64)->ArgName("MiB")->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_collective, all_reduce, Op::all_reduce)->Apply(sizes);
BENCHMARK_CAPTURE(BM_collective, all_gather, Op::all_gather)->Apply(sizes);
BENCHMARK_CAPTURE(BM_collective, all_to_all, Op::all_to_all)->Apply(sizes);

// ---- Data-parallel step: the gradient all-reduce after backward, or in buckets during it ----
//
// One step on every rank: forward and backward of an MLP (`layers` tanh(h @ W) layers of W x W f32,
// 1 MiB each at width 512) and the gradient average, either after backward (all_reduce_gradients,
// one bucket) or by GradientReducer (1 MiB buckets started as backward completes each layer's
// gradient, or all of them started in finish() for the same bucketing without overlap). The gap
// between the modes is the overlap the machine's cores allow: the progress threads reduce while the
// rank threads still compute.
enum class Reduce { after_backward, buckets_overlapped, buckets_in_finish };

struct RankModel {
  std::vector<Tensor> weights;  // (W, W) each
  Tensor input;                 // (B, W)
  std::unique_ptr<cpf::dist::GradientReducer> reducer;

  RankModel(int layers, int64_t width, int64_t batch, int rank) {
    cpf::Generator gen(static_cast<uint64_t>(rank + 1));
    input = cpf::uniform({batch, width}, -1, 1, {}, &gen);
    cpf::Generator same(42);  // the same weights on every rank
    for (int l = 0; l < layers; ++l) {
      weights.push_back(cpf::uniform({width, width}, -0.05, 0.05, {}, &same));
      weights.back().set_requires_grad(true);
    }
  }
  // Collective: every rank builds its reducer at the same time.
  void make_reducer(Reduce mode, const cpf::dist::ProcessGroupPtr& pg) {
    if (mode == Reduce::after_backward) return;
    reducer = std::make_unique<cpf::dist::GradientReducer>(
        weights, pg,
        cpf::dist::GradientReducerOptions{.bucket_bytes = kMiB,
                                          .start_in_backward = mode == Reduce::buckets_overlapped});
  }
  void step(ProcessGroup& pg) {
    Tensor h = input;
    for (const Tensor& w : weights) h = cpf::tanh(cpf::matmul(h, w));  // (B, W)
    cpf::backward(cpf::sum(h));
    if (reducer) {
      reducer->finish();
    } else {
      cpf::dist::all_reduce_gradients(weights, pg, cpf::dist::ReduceOp::avg);
    }
    for (const Tensor& w : weights) w.set_grad(Tensor());
  }
};

void BM_data_parallel_step(benchmark::State& state, Reduce mode) {
  const int n = static_cast<int>(state.range(0));
  const int layers = static_cast<int>(state.range(1));
  constexpr int64_t kWidth = 512, kBatch = 256;
  std::optional<RankModel> model;  // rank 0's, built once the helpers run (make_reducer is collective)
  {
    // A helper's model lives as long as its step, on the helper's thread.
    LockstepRanks ranks(n, [&](int r, const cpf::dist::ProcessGroupPtr& group) -> LockstepRanks::Step {
      auto rank_model = std::make_shared<RankModel>(layers, kWidth, kBatch, r);
      rank_model->make_reducer(mode, group);
      return [rank_model, group] { rank_model->step(*group); };
    });
    model.emplace(layers, kWidth, kBatch, 0);
    model->make_reducer(mode, ranks.group(0));
    const auto one_step = [&] { ranks.step([&] { model->step(*ranks.group(0)); }); };
    one_step();  // warm-up
    for (auto _ : state) one_step();
  }
  state.counters["steps/s"] = benchmark::Counter(1.0, benchmark::Counter::kIsIterationInvariantRate);
}

void dp_shapes(benchmark::internal::Benchmark* b) {
  for (int n : {2, 4}) b->Args({n, 8});
  b->ArgNames({"ranks", "layers"})->UseRealTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK_CAPTURE(BM_data_parallel_step, after_backward, Reduce::after_backward)->Apply(dp_shapes);
BENCHMARK_CAPTURE(BM_data_parallel_step, buckets_overlapped, Reduce::buckets_overlapped)->Apply(dp_shapes);
BENCHMARK_CAPTURE(BM_data_parallel_step, buckets_in_finish, Reduce::buckets_in_finish)->Apply(dp_shapes);

}  // namespace

BENCHMARK_MAIN();
