// thd calls split into groups of similar lengths (attention/cuda/cudnn/document_groups.h).
#include "attention/cuda/cudnn/document_groups.h"

#include <algorithm>
#include <limits>
#include <map>
#include <utility>

#include "framework/core/error.h"

namespace cpf::attention_cuda::cudnn {
namespace {

// cuDNN's thd s dims are multiples of this (attention/cuda/cudnn/problem_mapping.cpp's kThdLengthQuantum).
constexpr int64_t kQuantum = 128;
int64_t rounded(int64_t n) { return (n + kQuantum - 1) / kQuantum * kQuantum; }

// Entries that share their rounded (q, kv) lengths: they always go to the same group.
struct LengthClass {
  int64_t s_q = 0, s_kv = 0, count = 0;
};

// The classes, longest (by s_q + s_kv, then s_q) first, and each entry's class.
std::vector<LengthClass> length_classes(const SdpaMapping& m, std::vector<size_t>& class_of) {
  std::map<std::pair<int64_t, int64_t>, int64_t> counts;
  for (int64_t i = 0; i < m.b; ++i) {
    counts[{rounded(m.seq_len_q[static_cast<size_t>(i)]), rounded(m.seq_len_kv[static_cast<size_t>(i)])}] += 1;
  }
  std::vector<LengthClass> classes;
  for (const auto& [key, count] : counts) classes.push_back({key.first, key.second, count});
  std::sort(classes.begin(), classes.end(), [](const LengthClass& a, const LengthClass& b) {
    return a.s_q + a.s_kv != b.s_q + b.s_kv ? a.s_q + a.s_kv > b.s_q + b.s_kv : a.s_q > b.s_q;
  });
  std::map<std::pair<int64_t, int64_t>, size_t> index;
  for (size_t c = 0; c < classes.size(); ++c) index[{classes[c].s_q, classes[c].s_kv}] = c;
  class_of.clear();
  for (int64_t i = 0; i < m.b; ++i) {
    class_of.push_back(
        index.at({rounded(m.seq_len_q[static_cast<size_t>(i)]), rounded(m.seq_len_kv[static_cast<size_t>(i)])}));
  }
  return classes;
}

// The cheapest cut of the classes (in order) into consecutive runs: the start of each run.
std::vector<size_t> cheapest_cut(const std::vector<LengthClass>& classes, int64_t call_rows) {
  const size_t k = classes.size();
  std::vector<int64_t> best(k + 1, std::numeric_limits<int64_t>::max());
  std::vector<size_t> start(k + 1, 0);
  best[0] = 0;
  for (size_t j = 1; j <= k; ++j) {
    int64_t count = 0, s_q = 0, s_kv = 0;
    for (size_t i = j; i-- > 0;) {  // the run [i, j): its dims are its longest class's
      count += classes[i].count;
      s_q = std::max(s_q, classes[i].s_q);
      s_kv = std::max(s_kv, classes[i].s_kv);
      const int64_t cost = best[i] + sdpa_rows(count, s_q, s_kv) + call_rows;
      if (cost < best[j]) {
        best[j] = cost;
        start[j] = i;
      }
    }
  }
  std::vector<size_t> starts;
  for (size_t j = k; j > 0; j = start[j]) starts.push_back(start[j]);
  std::reverse(starts.begin(), starts.end());
  return starts;
}

SdpaGroup whole_call(const SdpaMapping& m) {
  SdpaGroup g{{}, m.s_q, m.s_kv};
  for (int64_t i = 0; i < m.b; ++i) g.entries.push_back(i);
  return g;
}

}  // namespace

int64_t sdpa_rows(int64_t b, int64_t s_q, int64_t s_kv) { return b * (s_q + s_kv); }

std::vector<SdpaGroup> group_entries_by_length(const SdpaMapping& m, int64_t call_rows) {
  CPF_CHECK(call_rows >= 0, "group_entries_by_length: call_rows=", call_rows,
            " must be >= 0 (the cost of one more cuDNN execution, in buffer rows)");
  if (!m.reason.empty() || !m.ragged || m.b <= 1) return {whole_call(m)};
  std::vector<size_t> class_of;
  const std::vector<LengthClass> classes = length_classes(m, class_of);
  const std::vector<size_t> starts = cheapest_cut(classes, call_rows);
  if (starts.size() <= 1) return {whole_call(m)};
  std::vector<size_t> group_of_class(classes.size(), 0);
  std::vector<SdpaGroup> groups(starts.size());
  for (size_t g = 0; g < starts.size(); ++g) {
    const size_t end = g + 1 < starts.size() ? starts[g + 1] : classes.size();
    for (size_t c = starts[g]; c < end; ++c) {
      group_of_class[c] = g;
      groups[g].s_q = std::max(groups[g].s_q, classes[c].s_q);
      groups[g].s_kv = std::max(groups[g].s_kv, classes[c].s_kv);
    }
  }
  for (int64_t i = 0; i < m.b; ++i) groups[group_of_class[class_of[static_cast<size_t>(i)]]].entries.push_back(i);
  return groups;
}

SdpaMapping group_mapping(const SdpaMapping& m, const SdpaGroup& group) {
  CPF_CHECK(!group.entries.empty(), "group_mapping: a group without entries");
  SdpaMapping g = m;
  g.seq_len_q.clear();
  g.seq_len_kv.clear();
  g.q_token.clear();
  g.kv_token.clear();
  for (const int64_t i : group.entries) {
    CPF_CHECK(i >= 0 && i < m.b, "group_mapping: entry ", i, " is not one of the mapping's ", m.b);
    const auto e = static_cast<size_t>(i);
    CPF_CHECK(m.seq_len_q[e] <= group.s_q && m.seq_len_kv[e] <= group.s_kv, "group_mapping: entry ", i, " has ",
              m.seq_len_q[e], " queries and ", m.seq_len_kv[e], " keys, more than the group's s_q=", group.s_q,
              " s_kv=", group.s_kv);
    g.seq_len_q.push_back(m.seq_len_q[e]);
    g.seq_len_kv.push_back(m.seq_len_kv[e]);
    g.q_token.push_back(m.q_token[e]);
    g.kv_token.push_back(m.kv_token[e]);
  }
  g.b = static_cast<int64_t>(group.entries.size());
  g.s_q = group.s_q;
  g.s_kv = group.s_kv;
  g.q_undefined.clear();
  g.kv_undefined.clear();
  return g;
}

}  // namespace cpf::attention_cuda::cudnn
