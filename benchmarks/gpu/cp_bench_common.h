#pragma once
// Shared by the multi-GPU CP benchmarks (gpu_cp_bench, gpu_cp_mla_latent_bench): batch sizing and the
// median of the timed batches, and their common command line (--ranks, --tokens, --strategies,
// --max-call-seconds; flags they do not know, e.g. run_suite.sh's --benchmark_* ones, are ignored).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "framework/tensor/cuda/cuda.h"

namespace cpf::bench {

using Clock = std::chrono::steady_clock;

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Calls per timed batch: about half a second of work, at least 1.
inline int reps_for(double seconds_per_call) {
  return std::clamp(static_cast<int>(0.5 / std::max(seconds_per_call, 1e-6)), 1, 20);
}

// "a,b,,c" -> {"a", "b", "c"}.
inline std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream ss(text);
  for (std::string part; std::getline(ss, part, ',');) {
    if (!part.empty()) parts.push_back(part);
  }
  return parts;
}

// The command line of a CP benchmark; the caller sets the defaults before parse_cp_bench_args.
struct CpBenchArgs {
  int ranks = cuda::device_count();
  std::vector<int64_t> tokens = {16384, 65536};
  std::vector<std::string> strategies;
  double max_call_seconds = 30;
};

inline void parse_cp_bench_args(int argc, char** argv, CpBenchArgs& args) {
  for (int i = 1; i + 1 < argc; ++i) {
    const std::string flag = argv[i];
    const char* value = argv[i + 1];
    if (flag == "--ranks") {
      args.ranks = std::atoi(value);
    } else if (flag == "--tokens") {
      args.tokens.clear();
      for (const std::string& t : split_list(value)) args.tokens.push_back(std::atoll(t.c_str()));
    } else if (flag == "--strategies") {
      args.strategies = split_list(value);
    } else if (flag == "--max-call-seconds") {
      args.max_call_seconds = std::atof(value);
    } else {
      continue;
    }
    ++i;
  }
}

// False (after saying so) unless 2 <= ranks <= the visible GPUs: a one-GPU machine has nothing to measure.
inline bool enough_gpus(const char* bench, int ranks) {
  if (ranks >= 2 && ranks <= cuda::device_count()) return true;
  std::printf("%s: needs 2 or more GPUs (--ranks %d), %d visible; nothing to measure\n", bench, ranks,
              cuda::device_count());
  return false;
}

}  // namespace cpf::bench
