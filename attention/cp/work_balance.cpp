#include "attention/cp/work_balance.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <numeric>

#include "attention/cp/sharding.h"
#include "framework/core/error.h"

namespace cpf::cp {
namespace {

// Causal pairs of the queries at positions [begin, end) of a document with `real` real tokens: the
// query at position i sees keys 0..i.
double prefix_pairs(int64_t begin, int64_t end, int64_t real) {
  end = std::min(end, real);
  if (end <= begin) return 0;
  return static_cast<double>(begin + 1 + end) * static_cast<double>(end - begin) / 2;
}

// Pairs of the two dual chunks rank `rank` holds, summed over the documents.
double rank_pairs(const std::vector<int64_t>& cu, const std::vector<int64_t>& padded, int64_t cp_size, int64_t rank) {
  double pairs = 0;
  for (size_t n = 0; n + 1 < cu.size(); ++n) {
    const int64_t real = cu[n + 1] - cu[n], chunk = (padded[n + 1] - padded[n]) / (2 * cp_size);
    for (const int64_t id : dual_chunk_ids(cp_size, rank)) pairs += prefix_pairs(id * chunk, (id + 1) * chunk, real);
  }
  return pairs;
}

}  // namespace

std::vector<double> causal_pairs_per_rank(const std::vector<int64_t>& cu_seqlens,
                                          const std::vector<int64_t>& cu_seqlens_padded, CommType comm, int64_t cp_size,
                                          int64_t a2a_size) {
  CPF_CHECK(cp_size >= 1, "causal_pairs_per_rank: cp_size=", cp_size, " must be at least 1");
  (void)thd_shard(cu_seqlens, cu_seqlens_padded, cp_size, 0);  // validates the lengths, naming them
  std::vector<double> own(static_cast<size_t>(cp_size));
  for (int64_t r = 0; r < cp_size; ++r) own[r] = rank_pairs(cu_seqlens, cu_seqlens_padded, cp_size, r);
  if (comm == CommType::p2p || comm == CommType::all_gather) return own;
  if (comm == CommType::a2a) {
    const double total = std::accumulate(own.begin(), own.end(), 0.0);
    return std::vector<double>(static_cast<size_t>(cp_size), total / static_cast<double>(cp_size));
  }
  CPF_CHECK(a2a_size >= 1 && cp_size % a2a_size == 0, "causal_pairs_per_rank (a2a+p2p): a2a_size=", a2a_size,
            " does not divide cp_size=", cp_size);
  std::vector<double> work(static_cast<size_t>(cp_size));
  for (int64_t g = 0; g < cp_size / a2a_size; ++g) {  // a2a group g: CP ranks g A .. g A + A - 1
    double group = 0;
    for (int64_t i = 0; i < a2a_size; ++i) group += own[g * a2a_size + i];
    for (int64_t i = 0; i < a2a_size; ++i) work[g * a2a_size + i] = group / static_cast<double>(a2a_size);
  }
  return work;
}

double work_imbalance(const std::vector<double>& per_rank) {
  CPF_CHECK(!per_rank.empty(), "work_imbalance: no ranks");
  const double mean = std::accumulate(per_rank.begin(), per_rank.end(), 0.0) / static_cast<double>(per_rank.size());
  const double most = *std::max_element(per_rank.begin(), per_rank.end());
  return mean > 0 ? most / mean : 1.0;
}

std::vector<int64_t> packed_document_lengths(int64_t total, uint64_t seed, int64_t min_len, int64_t max_len,
                                             double median, double sigma) {
  CPF_CHECK(total > 0 && min_len >= 1 && max_len >= min_len && median > 0 && sigma >= 0,
            "packed_document_lengths: total=", total, " min_len=", min_len, " max_len=", max_len, " median=", median,
            " sigma=", sigma, " (need total > 0, 1 <= min_len <= max_len, median > 0, sigma >= 0)");
  // splitmix64 and Box-Muller: the same lengths from every standard library.
  uint64_t state = seed;
  auto uniform = [&] {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return (static_cast<double>(z >> 11) + 0.5) / 9007199254740992.0;  // (0, 1)
  };
  std::vector<int64_t> lengths;
  int64_t sum = 0;
  while (sum < total) {
    const double normal = std::sqrt(-2 * std::log(uniform())) * std::cos(2 * std::numbers::pi * uniform());
    auto len = static_cast<int64_t>(std::llround(median * std::exp(sigma * normal)));
    len = std::clamp(len, min_len, max_len);
    len = std::min(len, total - sum);
    lengths.push_back(len);
    sum += len;
  }
  return lengths;
}

}  // namespace cpf::cp
