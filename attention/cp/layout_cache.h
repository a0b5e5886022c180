#pragma once
// make_group_layout with a per-thread memory of the last few results. A layout is a pure function of
// (the batch's global sequences, the CP size, the members) but costs O(tokens) host work with a sort
// (docs/cp.md, "Host work", gives its time). Every CP call of every layer rebuilt the same
// layouts, in series with the GPU at the start of each pass; with the cache only the first call of a
// batch shape pays (the key comparison is O(sequences), plus O(tokens) only for explicit positions).
#include <memory>
#include <vector>

#include "attention/cp/layout.h"

namespace cpf::cp {

// The layout make_group_layout(global, cp_size, members) returns, from this thread's cache when an
// equal key was seen among the last kLayoutCacheEntries calls. Shared and immutable.
inline constexpr size_t kLayoutCacheEntries = 8;
std::shared_ptr<const GroupLayout> cached_group_layout(const GlobalSequences& global, int64_t cp_size,
                                                       const std::vector<int>& members);

// p2p's ring: the cp_size single-rank layouts, element r = make_group_layout(global, cp_size, {r}),
// from a second per-thread cache of the same size and key (without members). One lookup per pass, and
// no copy of the layouts.
std::shared_ptr<const std::vector<GroupLayout>> cached_rank_layouts(const GlobalSequences& global, int64_t cp_size);

// One ring step's tile of a rank: whether any of its queries sees a key of the source rank's block
// (any_visible), and the pair SequenceInfo of the call (pair_sequence_info; empty when not visible).
struct RingTile {
  bool visible = false;
  SequenceInfo pair;
};

// Element s: the tile of rank `me`'s queries against rank s's keys over `layouts` (cached_rank_layouts'
// result) under `window`. Both are O(tokens) to make (benchmarks/cpu_cp_host_bench.cpp times them) and
// every layer's forward and backward ring of a batch shape asks again: the
// last kLayoutCacheEntries answers per thread are kept, keyed by the layouts object (the entry holds
// it, so its address cannot name another while the entry lives), me and the window. Immutable.
std::shared_ptr<const std::vector<RingTile>> cached_ring_tiles(
    const std::shared_ptr<const std::vector<GroupLayout>>& layouts, int me, const AttentionWindow& window);

}  // namespace cpf::cp
