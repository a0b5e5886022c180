// cpf::raw::matmul against the same Eigen product called directly, square f32 matrices.
//
//   build/cpu/benchmarks/cpu_matmul_bench --benchmark_repetitions=3 \
//       --benchmark_enable_random_interleaving=true --benchmark_report_aggregates_only=true
//
// Both sides run Eigen's GEMM with the same thread count (Eigen::nbThreads(), OpenMP's default), so
// the ratio cpf/eigen measures what the framework adds around it: validation, output allocation,
// the strided-view mapping and the batch loop. Target: cpf >= 90% of eigen.
// Counter GFLOPS = 2 * n^3 / time (wall clock; the GEMM runs on several threads).
#include <benchmark/benchmark.h>

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "framework/tensor/ops/matmul.h"
#include "framework/tensor/random.h"

namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMap = Eigen::Map<const RowMatrix>;

void set_counters(benchmark::State& state, int64_t n) {
  state.counters["GFLOPS"] =
      benchmark::Counter(2.0 * static_cast<double>(n) * n * n * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = Eigen::nbThreads();
}

// Random, never-zero inputs; checks once that both paths agree before anything is timed.
struct Operands {
  cpf::Tensor a, b;
  explicit Operands(int64_t n) {
    cpf::Generator gen(42);
    a = cpf::randn({n, n}, {}, &gen);
    b = cpf::randn({n, n}, {}, &gen);
    const cpf::Tensor c = cpf::raw::matmul(a, b);
    RowMatrix expected = ConstMap(a.data<float>(), n, n) * ConstMap(b.data<float>(), n, n);
    const float diff = (ConstMap(c.data<float>(), n, n) - expected).cwiseAbs().maxCoeff();
    if (!(diff <= 1e-3f * std::sqrt(static_cast<float>(n)))) {
      std::fprintf(stderr, "cpu_matmul_bench: cpf and eigen differ by %g at n=%lld\n", diff, static_cast<long long>(n));
      std::abort();
    }
  }
};

void BM_matmul_cpf(benchmark::State& state) {
  const int64_t n = state.range(0);
  const Operands in(n);
  for (auto _ : state) {
    cpf::Tensor c = cpf::raw::matmul(in.a, in.b);  // allocates its output, as every framework call does
    benchmark::DoNotOptimize(c.raw_data());
    benchmark::ClobberMemory();
  }
  set_counters(state, n);
}

void BM_matmul_eigen(benchmark::State& state) {
  const int64_t n = state.range(0);
  const Operands in(n);
  const ConstMap a(in.a.data<float>(), n, n), b(in.b.data<float>(), n, n);
  RowMatrix c(n, n);  // preallocated: the best case for Eigen
  for (auto _ : state) {
    c.noalias() = a * b;
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, n);
}

// Registered size by size so the two figures for one size sit next to each other in the output.
void register_all() {
  for (int64_t n : {256, 1024, 2048}) {
    benchmark::RegisterBenchmark("matmul_f32/cpf", BM_matmul_cpf)
        ->Arg(n)
        ->UseRealTime()
        ->MinWarmUpTime(0.2)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("matmul_f32/eigen", BM_matmul_eigen)
        ->Arg(n)
        ->UseRealTime()
        ->MinWarmUpTime(0.2)
        ->Unit(benchmark::kMillisecond);
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
