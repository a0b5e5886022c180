// Memory-bound CUDA kernels against the measured device-to-device copy (cudaMemcpy through the
// backend): our copy kernel, add, gelu (f32 and bf16), a bias add, sum, softmax, layer_norm and the
// cross-entropy forward. The target is >= 80% of the copy's bandwidth. Ends with a
// table of GB/s and the ratio.
//
//   gpu_elementwise_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
//
// GB/s = (bytes read + bytes written) / time, each operand counted once. Sizes (2^26 = 64M elements,
// 256 MB in f32) are far larger than the 50-60 MB L2, so every byte comes from HBM.
#include <cstdio>
#include <vector>

#include "benchmarks/gpu/gpu_bench_util.h"
#include "framework/tensor/ops/cross_entropy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/norm.h"
#include "framework/tensor/ops/reduce.h"
#include "framework/tensor/ops/softmax.h"
#include "framework/tensor/storage.h"

namespace {

using namespace cpf;

DType dtype_arg(benchmark::State& state) { return state.range(1) == 0 ? DType::f32 : DType::bf16; }

void BM_memcpy_d2d(benchmark::State& state) {
  const int64_t n = state.range(0);
  bench::time_copy_roof(state, n);
}

void BM_copy_kernel(benchmark::State& state) {
  const int64_t n = state.range(0);
  Tensor src = bench::gpu_random({n}, DType::f32, 1);
  Tensor dst = empty({n}, {.device = Device::cuda()});
  bench::time_device(state, [&] { raw::copy_(dst, src); });
  bench::set_bytes(state, 2.0 * n * 4);
}

void BM_add(benchmark::State& state) {
  const int64_t n = state.range(0);
  const DType dtype = dtype_arg(state);
  Tensor a = bench::gpu_random({n}, dtype, 1), b = bench::gpu_random({n}, dtype, 2);
  bench::time_device(state, [&] { benchmark::DoNotOptimize(raw::add(a, b).raw_data()); });
  bench::set_bytes(state, 3.0 * n * static_cast<double>(dtype_size(dtype)));
}

void BM_gelu(benchmark::State& state) {
  const int64_t n = state.range(0);
  const DType dtype = dtype_arg(state);
  Tensor x = bench::gpu_random({n}, dtype, 1);
  bench::time_device(state, [&] { benchmark::DoNotOptimize(raw::unary(raw::UnaryOp::gelu, x).raw_data()); });
  bench::set_bytes(state, 2.0 * n * static_cast<double>(dtype_size(dtype)));
}

// (rows, 4096) + (4096): the bias-add pattern (the bias stays in cache: counted once).
void BM_bias_add(benchmark::State& state) {
  const int64_t n = state.range(0);
  Tensor a = bench::gpu_random({n / 4096, 4096}, DType::f32, 1), b = bench::gpu_random({4096}, DType::f32, 2);
  bench::time_device(state, [&] { benchmark::DoNotOptimize(raw::add(a, b).raw_data()); });
  bench::set_bytes(state, 2.0 * n * 4);
}

void BM_sum_rows(benchmark::State& state) {
  const int64_t n = state.range(0);
  Tensor x = bench::gpu_random({n / 4096, 4096}, DType::f32, 1);
  bench::time_device(state, [&] { benchmark::DoNotOptimize(raw::sum(x, {1}).raw_data()); });
  bench::set_bytes(state, 1.0 * n * 4);
}

void BM_sum_all(benchmark::State& state) {
  const int64_t n = state.range(0);
  Tensor x = bench::gpu_random({n}, DType::f32, 1);
  bench::time_device(state, [&] { benchmark::DoNotOptimize(raw::sum(x).raw_data()); });
  bench::set_bytes(state, 1.0 * n * 4);
}

void BM_softmax_rows(benchmark::State& state) {
  const int64_t n = state.range(0);
  const DType dtype = dtype_arg(state);
  Tensor x = bench::gpu_random({n / 1024, 1024}, dtype, 1);
  bench::time_device(state, [&] { benchmark::DoNotOptimize(raw::softmax(x, 1).raw_data()); });
  bench::set_bytes(state, 2.0 * n * static_cast<double>(dtype_size(dtype)));
}

// Rows of 4096 with weight and bias (cached: counted once); x read, y written.
void BM_layer_norm(benchmark::State& state) {
  const int64_t n = state.range(0);
  const DType dtype = dtype_arg(state);
  Tensor x = bench::gpu_random({n / 4096, 4096}, dtype, 1);
  Tensor w = bench::gpu_random({4096}, dtype, 2), b = bench::gpu_random({4096}, dtype, 3);
  bench::time_device(state, [&] { benchmark::DoNotOptimize(raw::layer_norm(x, w, b).y.raw_data()); });
  bench::set_bytes(state, 2.0 * n * static_cast<double>(dtype_size(dtype)));
}

// (2048, 32768) logits read once per call; includes the device-side target check and the mean-loss
// reduction (nothing is read back to the host).
void BM_cross_entropy(benchmark::State& state) {
  const int64_t n = state.range(0);
  const int64_t rows = n / 32768;
  Tensor x = bench::gpu_random({rows, 32768}, DType::f32, 1);
  std::vector<int64_t> t(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) t[r] = (r * 7919) % 32768;
  Tensor targets = raw::to(from_vector(t, {rows}), Device::cuda());
  bench::time_device(state, [&] { benchmark::DoNotOptimize(raw::cross_entropy(x, targets).lse.raw_data()); });
  bench::set_bytes(state, 1.0 * n * 4);
}

constexpr int64_t kN = int64_t(1) << 26;

BENCHMARK(BM_memcpy_d2d)->Arg(kN)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_copy_kernel)->Arg(kN)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_add)->Args({kN, 0})->Args({kN, 1})->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_gelu)->Args({kN, 0})->Args({kN, 1})->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_bias_add)->Arg(kN)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_sum_rows)->Arg(kN)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_sum_all)->Arg(kN)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_softmax_rows)->Args({kN, 0})->Args({kN, 1})->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_layer_norm)->Args({kN, 0})->Args({kN, 1})->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_cross_entropy)->Arg(kN)->UseManualTime()->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) {
  return cpf::bench::run_bandwidth_benchmarks(argc, argv, "gpu_elementwise_bench", "BM_memcpy_d2d/67108864/manual_time",
                                              "kernel (median)");
}
