#include "attention/cuda/cudnn/plan_cache.h"

#include <chrono>
#include <map>
#include <mutex>

#include "attention/cuda/cudnn/fused_attention.h"
#include "framework/core/error.h"
#include "framework/core/logging.h"
#include "framework/tensor/cuda/cuda.h"
#include "framework/tensor/cuda/runtime.cuh"

namespace cpf::attention_cuda::cudnn {
namespace {

thread_local PlanCacheStats thread_stats;

// Keys cuDNN offered no engine for, shared by all threads: that depends on the graph, not on the
// handle, and finding it out tries every engine configuration the heuristics list, which every rank
// thread of a process would otherwise pay for again.
std::mutex failures_mutex;
std::map<SdpaGraphKey, std::string> failures;

CachedPlan build_plan(const SdpaGraphKey& key) {
  CachedPlan entry;
  {
    std::lock_guard<std::mutex> lock(failures_mutex);
    if (auto it = failures.find(key); it != failures.end()) {
      entry.failure = it->second;
      return entry;
    }
  }
  const auto start = std::chrono::steady_clock::now();
  try {
    cuda::DeviceGuard guard(key.device);
    entry.plan = build_sdpa_plan(key, handle_for(key.device), &entry.failure);
  } catch (const Error& e) {
    entry.failure = e.what();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  thread_stats.builds += 1;
  thread_stats.build_seconds += seconds;
  // Plans take 0.1-1 s each: a run that builds many (a key that changes per call) shows up here.
  cpf::log(seconds >= 1.0 ? LogLevel::info : LogLevel::debug, "cuDNN attention plan ", key.str(), ": ",
           entry.plan ? "built" : "no engine", " in ", static_cast<int64_t>(seconds * 1e3), " ms (",
           thread_stats.builds, " builds on this thread)");
  if (!entry.plan) {
    entry.failure = "cuDNN found no engine for " + key.str() + ": " + entry.failure;
    std::lock_guard<std::mutex> lock(failures_mutex);
    failures.emplace(key, entry.failure);
  }
  return entry;
}

}  // namespace

const CachedPlan& cached_plan(const SdpaGraphKey& key) {
  thread_local std::map<SdpaGraphKey, CachedPlan> cache;
  auto it = cache.find(key);
  if (it != cache.end()) {
    thread_stats.hits += 1;
    return it->second;
  }
  return cache.emplace(key, build_plan(key)).first->second;
}

PlanCacheStats plan_cache_stats() { return thread_stats; }

}  // namespace cpf::attention_cuda::cudnn
