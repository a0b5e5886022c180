#include "attention/cuda/cudnn/problem_mapping_cache.h"

#include <algorithm>
#include <vector>

namespace cpf::attention_cuda::cudnn {
namespace {

bool same_sequence(const AttentionSequence& a, const AttentionSequence& b) {
  return a.q_row == b.q_row && a.q_col == b.q_col && a.q_len == b.q_len && a.kv_row == b.kv_row &&
         a.kv_col == b.kv_col && a.kv_len == b.kv_len && a.q_token == b.q_token && a.kv_token == b.kv_token;
}

// Every field map_to_cudnn may read (and the head counts and dims, which it does not read today, so
// that a mapping that starts to depend on them cannot be served stale). Cheap comparisons first.
bool same_problem(const AttentionProblem& a, const AttentionProblem& b) {
  return a.format == b.format && a.batch == b.batch && a.s_q == b.s_q && a.s_kv == b.s_kv && a.h_q == b.h_q &&
         a.h_kv == b.h_kv && a.d_qk == b.d_qk && a.d_v == b.d_v && a.window == b.window &&
         a.sequences.size() == b.sequences.size() &&
         std::equal(a.sequences.begin(), a.sequences.end(), b.sequences.begin(), same_sequence) && a.q_pos == b.q_pos &&
         a.kv_pos == b.kv_pos;
}

struct Entry {
  AttentionProblem problem;  // tensors (sink) dropped: not part of the key
  std::shared_ptr<const SdpaMapping> mapping;
};

}  // namespace

std::shared_ptr<const SdpaMapping> cached_mapping(const AttentionProblem& p) {
  // Per thread, most recent first: rank threads never share an entry, and no lock is needed.
  thread_local std::vector<Entry> entries;
  const auto hit =
      std::find_if(entries.begin(), entries.end(), [&](const Entry& e) { return same_problem(e.problem, p); });
  if (hit != entries.end()) {
    std::rotate(entries.begin(), hit, hit + 1);
    return entries.front().mapping;
  }
  auto mapping = std::make_shared<const SdpaMapping>(map_to_cudnn(p));
  AttentionProblem key = p;
  key.sink = Tensor();
  entries.insert(entries.begin(), Entry{std::move(key), mapping});
  if (entries.size() > kMappingCacheEntries) entries.pop_back();
  return mapping;
}

}  // namespace cpf::attention_cuda::cudnn
