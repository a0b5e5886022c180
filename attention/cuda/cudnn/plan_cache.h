#pragma once
// The execution plans of cuDNN attention graphs, built once per key and thread (private to
// cpf_attention_cuda; used by fused_attention.cpp). A plan is bound to the cuDNN handle it was built
// with and handles are per thread, so each thread keeps its own plans; the keys cuDNN offers no engine
// for are remembered for every thread, since finding that out tries every engine configuration the
// heuristics list. plan_cache_stats() (fused_attention.h) counts this thread's builds and hits.
#include <memory>
#include <string>

#include "attention/cuda/cudnn/backend_api.h"
#include "attention/cuda/cudnn/graph_building.h"

namespace cpf::attention_cuda::cudnn {

// A key's plan, or why cuDNN offered none (then plan is null).
struct CachedPlan {
  std::shared_ptr<ExecutionPlan> plan;
  std::string failure;
};

// The plan of `key` from this thread's cache, built (or its failure recalled) on a miss.
const CachedPlan& cached_plan(const SdpaGraphKey& key);

}  // namespace cpf::attention_cuda::cudnn
