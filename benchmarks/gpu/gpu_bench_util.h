#pragma once
// Shared by the GPU benchmarks: timing with a device synchronisation around a batch of launches, the
// bandwidth counter and its copy roof, and a reporter that keeps the figures for the closing summary
// table.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <string>

#include "framework/tensor/cuda/cuda.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/random.h"
#include "framework/tensor/storage.h"

namespace cpf::bench {

// Calls timed per benchmark iteration: counters multiply their per-call amounts by this.
inline constexpr int kReps = 10;

// Times kReps back-to-back calls of fn per benchmark iteration, between device synchronisations
// (UseManualTime: the reported Time is that of kReps calls). The synchronisation's cost (~10 us) is
// spread over the batch; sizes are chosen so that one call takes well over 50 us.
template <class Fn>
void time_device(benchmark::State& state, Fn&& fn) {
  const int reps = kReps;
  fn();  // warm-up: module load, cuBLASLt heuristics, allocator cache
  cuda::synchronize();
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) fn();
    cuda::synchronize();
    const auto t1 = std::chrono::steady_clock::now();
    state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
  }
}

// The "GB/s" counter of a bandwidth benchmark: `bytes` moved by one call (read + written), kReps calls
// per iteration.
inline void set_bytes(benchmark::State& state, double bytes) {
  state.counters["GB/s"] = benchmark::Counter(bytes * kReps * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// Uniform random values (never zeros: see METHOD.md) drawn on the host, then moved to the GPU.
inline Tensor gpu_random(const Shape& shape, DType dtype, uint64_t seed) {
  Generator gen(seed);
  return raw::to(uniform(shape, -1.0, 1.0, {.dtype = dtype}, &gen), Device::cuda(0));
}

// The roof of a bandwidth benchmark: a device-to-device copy of n f32 values through the backend
// (cudaMemcpy), read and written, so 8n bytes a call.
inline void time_copy_roof(benchmark::State& state, int64_t n) {
  Tensor src = gpu_random({n}, DType::f32, 1);
  Tensor dst = empty({n}, {.device = Device::cuda()});
  DeviceBackend& backend = device_backend(DeviceType::cuda);
  const size_t bytes = static_cast<size_t>(n) * 4;
  time_device(state, [&] { backend.copy(dst.raw_data(), dst.device(), src.raw_data(), src.device(), bytes); });
  set_bytes(state, 2.0 * static_cast<double>(bytes));
}

// Console output plus the median of one counter per benchmark family (name without /repeats).
class SummaryReporter : public benchmark::ConsoleReporter {
 public:
  explicit SummaryReporter(std::string counter) : counter_(std::move(counter)) {}
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      // Single runs first; with repetitions the median (reported after them) replaces them.
      if (run.run_type == Run::RT_Aggregate && run.aggregate_name != "median") continue;
      auto it = run.counters.find(counter_);
      if (it != run.counters.end()) values_[run.run_name.str()] = it->second.value;
    }
  }
  const std::map<std::string, double>& values() const { return values_; }

 private:
  std::string counter_;
  std::map<std::string, double> values_;
};

// The closing table of a bandwidth benchmark: every benchmark's median GB/s and its share of the
// measured device-to-device copy (`roof_name`, the copy benchmark's name as the reporter keeps it).
inline void print_copy_roof_table(const SummaryReporter& reporter, const std::string& roof_name, const char* header) {
  const auto& v = reporter.values();
  const auto it = v.find(roof_name);
  const double roof = it != v.end() ? it->second : 0.0;
  std::printf("\n%-44s %10s %14s\n", header, "GB/s", "vs D2D copy");
  for (const auto& [name, gbs] : v) {
    std::printf("%-44s %10.1f %13.1f%%\n", name.c_str(), gbs, roof > 0 ? 100.0 * gbs / roof : 0.0);
  }
}

// True, after saying so, when no CUDA device is visible: a benchmark program then exits 0 having
// measured nothing (the CPU-only CI builds and starts them).
inline bool no_device_to_measure(const char* program) {
  if (cuda::is_available()) return false;
  std::printf("%s: no CUDA device is visible; nothing to measure\n", program);
  return true;
}

// main() of a bandwidth benchmark: runs the registered benchmarks, then prints the GB/s table against
// the device-to-device copy (print_copy_roof_table).
inline int run_bandwidth_benchmarks(int argc, char** argv, const char* program, const std::string& roof_name,
                                    const char* header) {
  benchmark::Initialize(&argc, argv);
  if (no_device_to_measure(program)) return 0;
  SummaryReporter reporter("GB/s");
  benchmark::RunSpecifiedBenchmarks(&reporter);
  print_copy_roof_table(reporter, roof_name, header);
  benchmark::Shutdown();
  return 0;
}

}  // namespace cpf::bench
