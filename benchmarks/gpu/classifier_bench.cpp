// The fused classifier (framework/tensor/ops/classifier_loss.h) against the unfused path it replaces,
// at GPT-2 124M's training shape: hidden (32768, 768), vocab 50304, bf16. One call is the LM head's
// forward and backward with the loss:
//   unfused: logits = h @ W^T (the whole (T, V)), cross_entropy, its backward (dlogits, a second (T, V)),
//            dh = dlogits @ W, dW = dlogits^T @ h                   (what autograd runs, less the casts)
//   fused:   raw::classifier_loss over row chunks (chunk_rows 0 = by memory: 10624 rows here)
//
//   gpu_classifier_bench --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
//
// Counters: TFLOPS = the three GEMMs' 6 T C V flops / time; peak_GiB = the allocator's peak during one
// call beyond what was allocated before it (cuda::memory_stats), i.e. the path's working memory.
#include <cstdio>

#include "benchmarks/gpu/gpu_bench_util.h"
#include "framework/tensor/ops/classifier_loss.h"
#include "framework/tensor/ops/cross_entropy.h"
#include "framework/tensor/ops/matmul.h"
#include "framework/tensor/ops/views.h"

namespace {

using namespace cpf;

constexpr int64_t kRows = 32768, kWidth = 768, kVocab = 50304;

struct Inputs {
  Tensor hidden, weight, labels;
};

const Inputs& inputs() {
  static const Inputs in = [] {
    Inputs x;
    x.hidden = bench::gpu_random({kRows, kWidth}, DType::bf16, 1);
    x.weight = bench::gpu_random({kVocab, kWidth}, DType::bf16, 2);
    std::vector<int64_t> l(static_cast<size_t>(kRows));
    for (int64_t r = 0; r < kRows; ++r) l[r] = (r * 7919 + 13) % kVocab;
    x.labels = raw::to(from_vector(l, {kRows}), Device::cuda(0));
    return x;
  }();
  return in;
}

// The unfused head + loss: the whole logits and their gradient.
void unfused(const Inputs& in) {
  const Tensor logits = raw::matmul(in.hidden, raw::transpose(in.weight, 0, 1));  // (T, V)
  const raw::CrossEntropyResult ce = raw::cross_entropy(logits, in.labels);
  const Tensor one = raw::to(scalar_tensor(1.0, {.dtype = DType::f32}), Device::cuda(0));
  const Tensor dlogits = raw::cross_entropy_backward(one, logits, in.labels, ce.lse, ce.count);  // (T, V)
  const Tensor dh = raw::matmul(dlogits, in.weight);                                             // (T, C)
  const Tensor dw = raw::matmul(raw::transpose(dlogits, 0, 1), in.hidden);                       // (V, C)
}

void fused(const Inputs& in, int64_t chunk_rows) {
  // The valid-label count given, as the training step gives it: no read-back of the labels per call.
  const auto r = raw::classifier_loss(in.hidden, in.weight, in.labels, {.normalizer = kRows, .chunk_rows = chunk_rows});
}

template <class Fn>
void run(benchmark::State& state, Fn&& fn) {
  const Inputs& in = inputs();
  cuda::synchronize();
  const size_t before = cuda::memory_stats(0).allocated;
  cuda::reset_peak_memory_stats(0);
  fn(in);
  cuda::synchronize();
  const double peak = static_cast<double>(cuda::memory_stats(0).peak_allocated - before);
  bench::time_device(state, [&] { fn(in); });
  const double flops = 6.0 * kRows * kWidth * kVocab;
  state.counters["TFLOPS"] =
      benchmark::Counter(flops * bench::kReps / 1e12, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["peak_GiB"] = peak / double(1 << 30);
}

void BM_Unfused(benchmark::State& state) {
  run(state, [](const Inputs& in) { unfused(in); });
}
void BM_Fused(benchmark::State& state) {
  const int64_t chunk = state.range(0);
  run(state, [chunk](const Inputs& in) { fused(in, chunk); });
}

BENCHMARK(BM_Unfused)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);
// 0 = chosen by memory (4 equal chunks of 8192 rows, 786 MiB of logits each); 2560 rows was the old 256 MiB budget;
// larger chunks trade memory for fewer dweight accumulations.
BENCHMARK(BM_Fused)
    ->Arg(0)
    ->Arg(2560)
    ->Arg(4096)
    ->Arg(8192)
    ->Arg(16384)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (!cuda::is_available()) {
    std::printf("gpu_classifier_bench: no CUDA device is visible\n");
    return 0;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
