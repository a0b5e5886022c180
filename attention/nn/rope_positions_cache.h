#pragma once
// The RoPE position tables of the attention modules, built and uploaded once per batch layout.
//
// Every layer of a step rotates q and k at the same positions, and a run of fixed batch shapes presents
// the same positions every step: building them (resolving SequenceInfo positions for the whole global
// batch, and under CP the rank's dual-chunk shard) and uploading them cost more host time than the
// RoPE kernels' launches. The cache hands back the table it made for an equal request instead.
//
// Keyed by everything the table depends on: x's device, the calling thread's current stream of it (a
// table is only served to work queued on the stream it was uploaded on, so it cannot be read before its
// copy lands), the qkv_format, x's token dims (all but the trailing (H, D)), q or kv side, the CP size
// and rank, and the side's sequence arrays of `seq` (cu_seqlens, cu_seqlens_padded and the explicit
// positions), compared element by element. Per thread (rank threads never share an entry), the
// kRopePositionsCacheEntries most recently used. Tables are never written: callers only read them.
#include <cstddef>
#include <cstdint>
#include <optional>

#include "attention/sequence_info.h"
#include "attention/spec.h"
#include "framework/tensor/tensor.h"

namespace cpf::nn {

inline constexpr size_t kRopePositionsCacheEntries = 8;

// rope_positions(x_heads, format, seq, kv) when cp_size == 1, else cp_rope_positions(x_heads, format,
// seq, kv, cp_size, cp_rank) (attention_layout.h): a cached table when an equal request came before.
Tensor cached_rope_positions(const Tensor& x_heads, QkvFormat format, const std::optional<SequenceInfo>& seq, bool kv,
                             int64_t cp_size = 1, int64_t cp_rank = 0);

// True when seq's query and key tokens lie in the same slots at the same positions (self-attention's
// usual case): then one positions table serves q and k. Decided on the arrays, without resolving
// the per-token positions unless exactly one side has explicit ones.
bool same_rope_positions(const SequenceInfo& seq);

// Tables this thread built (and uploaded) / served from its cache since it started (for tests).
struct RopePositionsCacheStats {
  uint64_t builds = 0, hits = 0;
};
RopePositionsCacheStats rope_positions_cache_stats();

}  // namespace cpf::nn

// The helpers' namespace before the folder was renamed (attention/modules, cpf::attention_modules):
// an alias kept for one release (deprecated in 0.1, removed in 0.2).
namespace cpf {
namespace attention_modules = nn;
}  // namespace cpf
