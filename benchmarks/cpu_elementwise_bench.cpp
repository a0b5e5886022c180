// Memory-bound CPU kernels: element-wise add (contiguous and broadcast), unary gelu/exp and softmax
// over the last dim, next to a plain copy (raw::clone and memcpy) as the bandwidth roof.
//
//   build/cpu/benchmarks/cpu_elementwise_bench --benchmark_repetitions=3 \
//       --benchmark_enable_random_interleaving=true --benchmark_report_aggregates_only=true
//
// Counter GB/s = (bytes read + bytes written) / wall time, counting each operand once (a broadcast
// operand counts its own size, not the expanded one). Outputs are allocated by every call, as the
// framework does; 1M-element tensors fit in the caches, 16M-element ones do not.
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/softmax.h"
#include "framework/tensor/random.h"

namespace {

constexpr int64_t kCols = 1024;

void set_bytes(benchmark::State& state, double bytes) {
  state.counters["GB/s"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

cpf::Tensor random(const cpf::Shape& shape, uint64_t seed) {
  cpf::Generator gen(seed);
  return cpf::randn(shape, {}, &gen);
}

// Shapes are (rows, 1024) with numel = range(0).
cpf::Shape matrix(int64_t numel) { return {numel / kCols, kCols}; }

void BM_copy_memcpy(benchmark::State& state) {
  const int64_t n = state.range(0);
  std::vector<float> src(n, 1.0f), dst(n);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), n * sizeof(float));
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  set_bytes(state, 2.0 * n * sizeof(float));
}

void BM_copy_clone(benchmark::State& state) {
  const int64_t n = state.range(0);
  const cpf::Tensor x = random(matrix(n), 1);
  for (auto _ : state) benchmark::DoNotOptimize(cpf::raw::clone(x).raw_data());
  set_bytes(state, 2.0 * n * sizeof(float));
}

void BM_add_contiguous(benchmark::State& state) {
  const int64_t n = state.range(0);
  const cpf::Tensor a = random(matrix(n), 1), b = random(matrix(n), 2);
  for (auto _ : state) benchmark::DoNotOptimize(cpf::raw::add(a, b).raw_data());
  set_bytes(state, 3.0 * n * sizeof(float));
}

// (rows, 1024) + (1024): the bias-add pattern.
void BM_add_broadcast_row(benchmark::State& state) {
  const int64_t n = state.range(0);
  const cpf::Tensor a = random(matrix(n), 1), b = random({kCols}, 2);
  for (auto _ : state) benchmark::DoNotOptimize(cpf::raw::add(a, b).raw_data());
  set_bytes(state, (2.0 * n + kCols) * sizeof(float));
}

// (rows, 1024) + (rows, 1): a per-row scalar, the inner dim is broadcast.
void BM_add_broadcast_col(benchmark::State& state) {
  const int64_t n = state.range(0);
  const cpf::Tensor a = random(matrix(n), 1), b = random({n / kCols, 1}, 2);
  for (auto _ : state) benchmark::DoNotOptimize(cpf::raw::add(a, b).raw_data());
  set_bytes(state, (2.0 * n + n / kCols) * sizeof(float));
}

template <cpf::raw::UnaryOp Op>
void BM_unary(benchmark::State& state) {
  const int64_t n = state.range(0);
  const cpf::Tensor x = random(matrix(n), 1);
  for (auto _ : state) benchmark::DoNotOptimize(cpf::raw::unary(Op, x).raw_data());
  set_bytes(state, 2.0 * n * sizeof(float));
}

// Softmax over the last dim of (rows, cols): range(0) = rows, range(1) = cols.
void BM_softmax_lastdim(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1);
  const cpf::Tensor x = random({rows, cols}, 1);
  for (auto _ : state) benchmark::DoNotOptimize(cpf::raw::softmax(x, -1).raw_data());
  set_bytes(state, 2.0 * rows * cols * sizeof(float));
}

constexpr int64_t kSmall = 1 << 20;  // 4 MiB per f32 tensor
constexpr int64_t kLarge = 1 << 24;  // 64 MiB per f32 tensor

#define CPF_BANDWIDTH_BENCH(fn) \
  BENCHMARK(fn)->Arg(kSmall)->Arg(kLarge)->UseRealTime()->MinWarmUpTime(0.1)->Unit(benchmark::kMicrosecond)

CPF_BANDWIDTH_BENCH(BM_copy_memcpy);
CPF_BANDWIDTH_BENCH(BM_copy_clone);
CPF_BANDWIDTH_BENCH(BM_add_contiguous);
CPF_BANDWIDTH_BENCH(BM_add_broadcast_row);
CPF_BANDWIDTH_BENCH(BM_add_broadcast_col);
CPF_BANDWIDTH_BENCH(BM_unary<cpf::raw::UnaryOp::gelu>)->Name("BM_unary_gelu");
CPF_BANDWIDTH_BENCH(BM_unary<cpf::raw::UnaryOp::exp>)->Name("BM_unary_exp");
BENCHMARK(BM_softmax_lastdim)
    ->Args({4096, 1024})
    ->Args({512, 32768})
    ->Args({16384, 1024})
    ->UseRealTime()
    ->MinWarmUpTime(0.1)
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
