// FP8 against bf16 on the GPU: cuBLASLt's FP8 GEMM (raw::fp8_matmul_nt, E4M3 x E4M3 -> bf16) next to the
// bf16 GEMM of the same linear (raw::linear), the scaled cast (raw::quantize_fp8) at the copy roof, and
// one fp8_linear forward + backward against the bf16 linear's. Shapes: 8192^3, and a Llama-3.2-1B
// layer at 8192 tokens (x (8192, 2048), MLP up (8192, 2048), down (2048, 8192)).
//
//   gpu_fp8_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
//
// TFLOP/s = 2 M N K / time (the linear's: three GEMMs for a forward + backward).
#include <cstdio>

#include "benchmarks/gpu/gpu_bench_util.h"
#include "framework/autograd/engine.h"
#include "framework/autograd/functions/fp8_linear.h"
#include "framework/autograd/functions/linear.h"
#include "framework/tensor/ops/fp8.h"
#include "framework/tensor/ops/linear.h"

namespace {

using namespace cpf;

void set_flops(benchmark::State& state, double flops) {
  state.counters["TFLOP/s"] =
      benchmark::Counter(flops * bench::kReps * 1e-12, benchmark::Counter::kIsIterationInvariantRate);
}

Tensor gpu_scalar(float v) { return raw::to(from_vector(std::vector<float>{v}, {}), Device::cuda(0)); }

// y (M, N) = x (M, K) W (N, K)^T: range(3) 0 = bf16 raw::linear, 1 = FP8 E4M3 raw::fp8_matmul_nt.
void BM_linear_gemm(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const bool fp8 = state.range(3) == 1;
  const Tensor x = bench::gpu_random({m, k}, DType::bf16, 1), w = bench::gpu_random({n, k}, DType::bf16, 2);
  const Tensor one = gpu_scalar(1.0f);
  const Tensor xq = raw::quantize_fp8(x, one, DType::f8e4m3), wq = raw::quantize_fp8(w, one, DType::f8e4m3);
  bench::time_device(state, [&] {
    if (fp8) {
      benchmark::DoNotOptimize(raw::fp8_matmul_nt(xq, one, wq, one, DType::bf16).raw_data());
    } else {
      benchmark::DoNotOptimize(raw::linear(x, w, Tensor()).raw_data());
    }
  });
  set_flops(state, 2.0 * m * n * k);
}

// The scaled cast of a (8192, 8192) bf16 tensor with its amax in the same pass: 2 + 1 bytes an element.
void BM_quantize(benchmark::State& state) {
  const Tensor x = bench::gpu_random({8192, 8192}, DType::bf16, 3);
  const Tensor scale = gpu_scalar(2.0f), amax = gpu_scalar(0.0f);
  bench::time_device(state,
                     [&] { benchmark::DoNotOptimize(raw::quantize_fp8(x, scale, DType::f8e4m3, amax).raw_data()); });
  bench::set_bytes(state, 3.0 * 8192 * 8192);
}

// One linear's forward and backward (three GEMMs): range(3) 0 = bf16 linear, 1 = fp8_linear (current
// scaling: amaxes, casts and transposes included).
void BM_linear_step(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const bool fp8 = state.range(3) == 1;
  Tensor x = bench::gpu_random({m, k}, DType::bf16, 4).set_requires_grad(true);
  Tensor w = bench::gpu_random({n, k}, DType::f32, 5).set_requires_grad(true);
  const Tensor w16 = raw::to(w, DType::bf16);
  const Tensor gy = bench::gpu_random({m, n}, DType::bf16, 6);
  bench::time_device(state, [&] {
    const Tensor y = fp8 ? fp8_linear(x, w) : linear(x, w, Tensor(), w16);
    backward(y, gy);
    x.set_grad(Tensor());
    w.set_grad(Tensor());
  });
  set_flops(state, 6.0 * m * n * k);
}

void shapes(benchmark::internal::Benchmark* b) {
  for (int impl : {0, 1}) {
    b->Args({8192, 8192, 8192, impl});
    b->Args({8192, 2048, 2048, impl});  // attention projection
    b->Args({8192, 8192, 2048, impl});  // MLP up
    b->Args({8192, 2048, 8192, impl});  // MLP down
  }
}

BENCHMARK(BM_linear_gemm)->Apply(shapes)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_quantize)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_linear_step)->Apply(shapes)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (cpf::bench::no_device_to_measure("gpu_fp8_bench")) return 0;
  cpf::bench::SummaryReporter reporter("TFLOP/s");
  benchmark::RunSpecifiedBenchmarks(&reporter);
  std::printf("\n%-52s %10s\n", "FP8 vs bf16 (median)", "TFLOP/s");
  for (const auto& [name, tflops] : reporter.values()) std::printf("%-52s %10.1f\n", name.c_str(), tflops);
  benchmark::Shutdown();
  return 0;
}
