#pragma once
// map_to_cudnn with a per-thread memory of the last few results (private to cpf_attention_cuda). The
// mapping walks every token's position (row intervals, undefined rows): O(tokens) host work a call, timed
// by benchmarks/cpu_cp_host_bench.cpp (docs/cp.md, "Host work"). Every layer of a CP step
// makes the same ring tiles (the same lengths and positions) in its forward and its backward, so after
// the first layer a tile's mapping is a lookup: a comparison of the problem's lengths and positions.
#include <cstddef>
#include <memory>

#include "attention/attention_problem.h"
#include "attention/cuda/cudnn/problem_mapping.h"

namespace cpf::attention_cuda::cudnn {

// The mapping map_to_cudnn(p) returns, shared from this thread's cache when a problem equal in every
// field but its tensors, scale and kernel config (format, batch, lengths, heads, dims, window,
// sequences, positions) was seen among the last kMappingCacheEntries calls. Immutable.
inline constexpr size_t kMappingCacheEntries = 16;
std::shared_ptr<const SdpaMapping> cached_mapping(const AttentionProblem& p);

}  // namespace cpf::attention_cuda::cudnn
