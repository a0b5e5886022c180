#pragma once
// The CP attention entries without the sharding check, for the library's own checked entries
// (context_parallel.h) only: they take q, k, v (or q and the MLA latent) to be this rank's dual-chunk
// shards without being told. Not installed (cmake/CpfInstall.cmake leaves internal/ folders out), so a
// user cannot call attention on tensors whose cut it never stated.
#include <memory>
#include <optional>

#include "attention/cp/context_parallel.h"

namespace cpf::cp::internal {

AttentionOutput context_parallel_attention_unchecked(const Tensor& q, const Tensor& k, const Tensor& v,
                                                     const AttentionSpec& spec, const std::optional<SequenceInfo>& seq,
                                                     const ContextParallel& cp, std::shared_ptr<CpStats> stats);

AttentionOutput context_parallel_mla_attention_unchecked(const Tensor& q, const Tensor& latent,
                                                         const Tensor& kv_b_weight, const Tensor& kv_b_bias,
                                                         const MlaLatentShape& shape, const AttentionSpec& spec,
                                                         const std::optional<SequenceInfo>& seq,
                                                         const ContextParallel& cp, std::shared_ptr<CpStats> stats);

}  // namespace cpf::cp::internal
