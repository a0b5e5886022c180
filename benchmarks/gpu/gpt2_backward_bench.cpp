// Two backward kernels of the GPT-2 124M step at its shape (T = 32768 tokens of 32 rows x 1024, C = 768):
//   BM_embedding_backward/<ids>  the token-embedding gradient into a 50304-row table; ids 0: the copy
//                                task's 14 distinct ids (runs of ~2300 rows), 1: text-like ids (every 4th
//                                one of 3 frequent ids, the rest spread over the table)
//   BM_add_norm_backward         the fused add + LayerNorm backward: f32 x1 and dx1, bf16 dy and dbranch,
//                                weight and bias gradients (one call of the step's 25)
//
//   gpu_gpt2_backward_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
//
// The reported Time is that of bench::kReps (10) calls; GB/s = (bytes read + written) per call / time
// per call, each operand counted once.
#include <cstdio>
#include <vector>

#include "benchmarks/gpu/gpu_bench_util.h"
#include "framework/tensor/ops/add_norm.h"
#include "framework/tensor/ops/embedding.h"

namespace {

using namespace cpf;

constexpr int64_t kTokens = 32768, kCols = 768, kVocab = 50304;

void set_bytes(benchmark::State& state, double bytes) {
  state.counters["GB/s"] =
      benchmark::Counter(bytes * bench::kReps * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

Tensor step_ids(bool text_like) {
  std::vector<int64_t> v(static_cast<size_t>(kTokens));
  for (int64_t i = 0; i < kTokens; ++i) {
    v[static_cast<size_t>(i)] =
        text_like ? (i % 4 == 0 ? (i / 4) % 3 : (i * 7919 + 13) % kVocab) : 100 + (i * 5 + i / 7) % 14;
  }
  return raw::to(from_vector(v, {kTokens}), Device::cuda(0));
}

void BM_embedding_backward(benchmark::State& state) {
  const Tensor ids = step_ids(state.range(0) == 1);
  const Tensor grad = bench::gpu_random({kTokens, kCols}, DType::f32, 1);  // (T, C)
  bench::time_device(state, [&] { benchmark::DoNotOptimize(raw::embedding_backward(grad, ids, kVocab).raw_data()); });
  // grad read once, ids read, the table written (zeroed, then the used rows).
  set_bytes(state, 4.0 * kTokens * kCols + 8.0 * kTokens + 4.0 * kVocab * kCols);
}

void BM_add_norm_backward(benchmark::State& state) {
  const Tensor x = bench::gpu_random({kTokens, kCols}, DType::f32, 2);
  const Tensor branch = bench::gpu_random({kTokens, kCols}, DType::bf16, 3);
  const Tensor w = bench::gpu_random({kCols}, DType::f32, 4), b = bench::gpu_random({kCols}, DType::f32, 5);
  const raw::AddNormResult f = raw::add_norm(raw::NormKind::layer_norm, x, branch, w, b, 1e-5, DType::bf16);
  const Tensor dx1 = bench::gpu_random({kTokens, kCols}, DType::f32, 6);
  const Tensor dy = bench::gpu_random({kTokens, kCols}, DType::bf16, 7);
  bench::time_device(state, [&] {
    const raw::AddNormGrads g = raw::add_norm_backward(raw::NormKind::layer_norm, dx1, dy, DType::bf16, f.x1, w, true,
                                                       f.mean, f.rstd, DType::bf16);
    benchmark::DoNotOptimize(g.dx.raw_data());
  });
  // dy (bf16), x1 and dx1 (f32) read; dx (f32) and dbranch (bf16) written; the parameter pass reads dy and x1.
  const double elems = static_cast<double>(kTokens) * kCols;
  set_bytes(state, elems * (2 + 4 + 4 + 4 + 2) + elems * (2 + 4));
}

BENCHMARK(BM_embedding_backward)->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_add_norm_backward)->UseManualTime()->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (!cpf::cuda::is_available()) {
    std::printf("gpu_gpt2_backward_bench: no CUDA device is visible; nothing to measure\n");
    return 0;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
