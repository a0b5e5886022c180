// cuBLASLt GEMMs through raw::matmul: bf16 8192^3 (the peer: 782 TFLOP/s through PyTorch on an H200,
// docs/gpu.md), f32 with and without TF32, a batched attention-shaped product, and the epilogue-fused
// linear ops of GPT-2's MLP (x (32768, 768), fc_in (3072, 768), bf16) against their unfused sequences:
//   BM_linear_gelu/0 linear then gelu           /1 raw::linear_gelu (GELU_AUX_BIAS)
//   BM_linear_dgelu/0 dH GEMM then gelu backward /1 raw::linear_dgelu (DGELU)
//   BM_weight_grad/0 bf16 dW GEMM + column fold + f32 casts (the path before)
//                  /1 raw::linear_param_grads: f32 dW and the bias gradient (BGRADB) in one GEMM
//
//   gpu_gemm_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
//
// TFLOP/s = 2 M N K (times the batch) / time. Inputs are uniform random in [-1, 1), never zeros.
#include <cstdio>

#include "benchmarks/gpu/gpu_bench_util.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/linear.h"
#include "framework/tensor/ops/matmul.h"
#include "framework/tensor/ops/reduce.h"
#include "framework/tensor/ops/views.h"

namespace {

using namespace cpf;

void set_flops(benchmark::State& state, double flops) {
  state.counters["TFLOP/s"] =
      benchmark::Counter(flops * bench::kReps * 1e-12, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_gemm(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const DType dtype = state.range(3) == 0 ? DType::bf16 : DType::f32;
  cuda::set_allow_tf32(state.range(3) == 2);
  Tensor a = bench::gpu_random({m, k}, dtype, 1), b = bench::gpu_random({k, n}, dtype, 2);
  bench::time_device(state, [&] { benchmark::DoNotOptimize(raw::matmul(a, b).raw_data()); });
  cuda::set_allow_tf32(false);
  set_flops(state, 2.0 * m * n * k);
}

// (B, H, T, D) @ (B, H, D, T): attention scores, bf16, batch strides read in place.
void BM_gemm_batched(benchmark::State& state) {
  const int64_t b = 4, h = 16, t = 2048, d = 128;
  Tensor q = bench::gpu_random({b, h, t, d}, DType::bf16, 1), kk = bench::gpu_random({b, h, t, d}, DType::bf16, 2);
  Tensor kt = raw::transpose(kk, 2, 3);
  bench::time_device(state, [&] { benchmark::DoNotOptimize(raw::matmul(q, kt).raw_data()); });
  set_flops(state, 2.0 * b * h * t * t * d);
}

// GPT-2 124M's MLP at 32 sequences of 1024 tokens: x (M, C) @ fc_in^T (C, I), bf16.
constexpr int64_t kRows = 32768, kModel = 768, kInner = 3072;

void BM_linear_gelu(benchmark::State& state) {
  const bool fused = state.range(0) == 1;
  Tensor x = bench::gpu_random({kRows, kModel}, DType::bf16, 1);
  Tensor w = bench::gpu_random({kInner, kModel}, DType::bf16, 2), b = bench::gpu_random({kInner}, DType::bf16, 3);
  bench::time_device(state, [&] {
    if (fused) {
      benchmark::DoNotOptimize(raw::linear_gelu(x, w, b).out.raw_data());
    } else {
      benchmark::DoNotOptimize(raw::unary(raw::UnaryOp::gelu, raw::linear(x, w, b)).raw_data());
    }
  });
  set_flops(state, 2.0 * kRows * kModel * kInner);
}

void BM_linear_dgelu(benchmark::State& state) {
  const bool fused = state.range(0) == 1;
  Tensor gy = bench::gpu_random({kRows, kModel}, DType::bf16, 1);
  Tensor w_out = bench::gpu_random({kModel, kInner}, DType::bf16, 2);  // fc_out (C, I)
  Tensor pre = bench::gpu_random({kRows, kInner}, DType::bf16, 3);
  bench::time_device(state, [&] {
    if (fused) {
      benchmark::DoNotOptimize(raw::linear_dgelu(gy, w_out, pre, false).grad_pre.raw_data());
    } else {
      Tensor gh = raw::matmul(gy, w_out);
      benchmark::DoNotOptimize(raw::unary_backward(raw::UnaryOp::gelu, gh, pre, pre).raw_data());
    }
  });
  set_flops(state, 2.0 * kRows * kModel * kInner);
}

void BM_weight_grad(benchmark::State& state) {
  const bool fused = state.range(0) == 1;
  Tensor gy = bench::gpu_random({kRows, kInner}, DType::bf16, 1);  // dPre (M, I)
  Tensor x = bench::gpu_random({kRows, kModel}, DType::bf16, 2);   // (M, C)
  bench::time_device(state, [&] {
    if (fused) {
      benchmark::DoNotOptimize(raw::linear_param_grads(gy, x, DType::f32, true).weight.raw_data());
    } else {
      Tensor dw = raw::to(raw::matmul(raw::transpose(gy, 0, 1), x), DType::f32);  // (I, C)
      Tensor db = raw::to(raw::sum(gy, {0}), DType::f32);                         // (I)
      benchmark::DoNotOptimize(dw.raw_data());
      benchmark::DoNotOptimize(db.raw_data());
    }
  });
  set_flops(state, 2.0 * kRows * kModel * kInner);
}

// Args: m, n, k, kind (0 bf16, 1 f32, 2 f32 with TF32).
BENCHMARK(BM_gemm)
    ->Args({8192, 8192, 8192, 0})
    ->Args({4096, 4096, 4096, 0})
    ->Args({4096, 4096, 4096, 1})
    ->Args({4096, 4096, 4096, 2})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
// The same 8192^3 bf16 product timed in short bursts (one iteration of 10 products per repetition, after a
// warm-up), closer to how the peer figure was taken (mean of 10 products after 3 warm-ups): sustained runs
// (above, >= 0.5 s each) let the GPU reach its power limit and lower its clocks.
BENCHMARK(BM_gemm)
    ->Name("BM_gemm_burst")
    ->Args({8192, 8192, 8192, 0})
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_gemm_batched)->UseManualTime()->Unit(benchmark::kMillisecond);
// Arg: 0 unfused (the path before), 1 one GEMM with the epilogue.
BENCHMARK(BM_linear_gelu)->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_linear_dgelu)->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_weight_grad)->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (cpf::bench::no_device_to_measure("gpu_gemm_bench")) return 0;
  cpf::bench::SummaryReporter reporter("TFLOP/s");
  benchmark::RunSpecifiedBenchmarks(&reporter);
  std::printf("\n%-44s %10s %16s\n", "GEMM (median)", "TFLOP/s", "vs 782 (H200 peer)");
  for (const auto& [name, tflops] : reporter.values()) {
    std::printf("%-44s %10.1f %15.1f%%\n", name.c_str(), tflops, 100.0 * tflops / 782.0);
  }
  benchmark::Shutdown();
  return 0;
}
