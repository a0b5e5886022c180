#include "attention/cp/layout_cache.h"

#include <algorithm>

#include "framework/core/error.h"

namespace cpf::cp {
namespace {

template <class Value>
struct Entry {
  GlobalSequences global;
  int64_t cp_size = 0;
  std::vector<int> members;
  std::shared_ptr<const Value> value;
};

template <class Value>
bool same_key(const Entry<Value>& e, const GlobalSequences& g, int64_t cp_size, const std::vector<int>& members) {
  return e.cp_size == cp_size && e.members == members && e.global.cu_seqlens == g.cu_seqlens &&
         e.global.cu_seqlens_padded == g.cu_seqlens_padded && e.global.q_positions == g.q_positions &&
         e.global.kv_positions == g.kv_positions;
}

// The value for the key from `entries` (most recent first), else build() kept as the newest entry.
// Per thread (the callers' thread_local vectors): rank threads never share an entry, and no lock is
// needed.
template <class Value, class Build>
std::shared_ptr<const Value> lookup(std::vector<Entry<Value>>& entries, const GlobalSequences& global, int64_t cp_size,
                                    const std::vector<int>& members, Build build) {
  const auto hit = std::find_if(entries.begin(), entries.end(),
                                [&](const Entry<Value>& e) { return same_key(e, global, cp_size, members); });
  if (hit != entries.end()) {
    std::rotate(entries.begin(), hit, hit + 1);
    return entries.front().value;
  }
  auto value = std::make_shared<const Value>(build());
  entries.insert(entries.begin(), Entry<Value>{global, cp_size, members, value});
  if (entries.size() > kLayoutCacheEntries) entries.pop_back();
  return value;
}

}  // namespace

std::shared_ptr<const GroupLayout> cached_group_layout(const GlobalSequences& global, int64_t cp_size,
                                                       const std::vector<int>& members) {
  thread_local std::vector<Entry<GroupLayout>> entries;
  return lookup(entries, global, cp_size, members, [&] { return make_group_layout(global, cp_size, members); });
}

std::shared_ptr<const std::vector<GroupLayout>> cached_rank_layouts(const GlobalSequences& global, int64_t cp_size) {
  thread_local std::vector<Entry<std::vector<GroupLayout>>> entries;
  return lookup(entries, global, cp_size, {}, [&] {
    std::vector<GroupLayout> layouts;
    layouts.reserve(static_cast<size_t>(cp_size));
    for (int r = 0; r < static_cast<int>(cp_size); ++r) layouts.push_back(make_group_layout(global, cp_size, {r}));
    return layouts;
  });
}

std::shared_ptr<const std::vector<RingTile>> cached_ring_tiles(
    const std::shared_ptr<const std::vector<GroupLayout>>& layouts, int me, const AttentionWindow& window) {
  CPF_CHECK(layouts != nullptr && me >= 0 && me < static_cast<int>(layouts->size()), "cached_ring_tiles: rank ", me,
            " is not one of the ", layouts ? layouts->size() : 0, " layouts");
  struct TilesEntry {
    std::shared_ptr<const std::vector<GroupLayout>> layouts;  // held: the identity stays unique
    int me = 0;
    AttentionWindow window;
    std::shared_ptr<const std::vector<RingTile>> tiles;
  };
  thread_local std::vector<TilesEntry> entries;
  const auto hit = std::find_if(entries.begin(), entries.end(), [&](const TilesEntry& e) {
    return e.layouts == layouts && e.me == me && e.window == window;
  });
  if (hit != entries.end()) {
    std::rotate(entries.begin(), hit, hit + 1);
    return entries.front().tiles;
  }
  auto tiles = std::make_shared<std::vector<RingTile>>(layouts->size());
  const GroupLayout& mine = (*layouts)[static_cast<size_t>(me)];
  for (size_t s = 0; s < layouts->size(); ++s) {
    RingTile& tile = (*tiles)[s];
    tile.visible = any_visible(mine, (*layouts)[s], window);
    if (tile.visible) tile.pair = pair_sequence_info(mine, (*layouts)[s]);
  }
  entries.insert(entries.begin(), TilesEntry{layouts, me, window, tiles});
  if (entries.size() > kLayoutCacheEntries) entries.pop_back();
  return tiles;
}

}  // namespace cpf::cp
