#include "attention/cp/layout_cache.h"

#include <algorithm>

namespace cpf::cp {
namespace {

struct Entry {
  GlobalSequences global;
  int64_t cp_size = 0;
  std::vector<int> members;
  std::shared_ptr<const GroupLayout> layout;
};

bool same_key(const Entry& e, const GlobalSequences& g, int64_t cp_size, const std::vector<int>& members) {
  return e.cp_size == cp_size && e.members == members && e.global.cu_seqlens == g.cu_seqlens &&
         e.global.cu_seqlens_padded == g.cu_seqlens_padded && e.global.q_positions == g.q_positions &&
         e.global.kv_positions == g.kv_positions;
}

}  // namespace

std::shared_ptr<const GroupLayout> cached_group_layout(const GlobalSequences& global, int64_t cp_size,
                                                       const std::vector<int>& members) {
  // Per thread: rank threads never share an entry, and no lock is needed. Most recent first.
  thread_local std::vector<Entry> entries;
  const auto hit = std::find_if(entries.begin(), entries.end(),
                                [&](const Entry& e) { return same_key(e, global, cp_size, members); });
  if (hit != entries.end()) {
    std::rotate(entries.begin(), hit, hit + 1);
    return entries.front().layout;
  }
  auto layout = std::make_shared<const GroupLayout>(make_group_layout(global, cp_size, members));
  entries.insert(entries.begin(), Entry{global, cp_size, members, layout});
  if (entries.size() > kLayoutCacheEntries) entries.pop_back();
  return layout;
}

}  // namespace cpf::cp
