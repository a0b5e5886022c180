#pragma once
// How evenly a CP strategy spreads the attention work of a packed (thd) batch over the ranks, computed
// from the sharding alone (no tensors), and the long-tailed document lengths the packed-document
// benchmark uses (gpu_cp_bench's thd case; docs/cp.md, "Packed documents").
//
// Work is counted in visible (query, key) pairs under a causal mask, which is what attention FLOPs
// are proportional to (2 (d_qk + d_v) FLOPs per pair and head, forward):
//   p2p, all_gather   rank r computes every pair of its own queries (chunks r and 2P-1-r of every
//                     document) against all keys;
//   a2a               every rank computes all pairs for H/P heads: total / P;
//   a2a+p2p (A x R)   a rank computes the pairs of its a2a group's queries for H/A heads.
// A document of real length L in a slot of Lp (a multiple of 2P) puts its real tokens first, so the
// last chunks of a padded document hold fewer real tokens (the clamp formula, sharding.h).
#include <cstdint>
#include <vector>

#include "attention/cp/context_parallel.h"

namespace cpf::cp {

// Visible causal (query, key) pairs per CP rank, in rank order. cu_seqlens are the real lengths,
// cu_seqlens_padded the slots (each a multiple of 2 * cp_size; validated as by thd_shard). a2a_size is
// the a2a sub-group size of a2a+p2p (it must divide cp_size) and is ignored by the other strategies.
std::vector<double> causal_pairs_per_rank(const std::vector<int64_t>& cu_seqlens,
                                          const std::vector<int64_t>& cu_seqlens_padded, CommType comm, int64_t cp_size,
                                          int64_t a2a_size = 1);

// max / mean of per-rank work: 1 is perfect balance; the step time follows the slowest rank.
double work_imbalance(const std::vector<double>& per_rank);

// Document lengths drawn from a lognormal distribution (median `median`, shape `sigma`) clipped to
// [min_len, max_len], deterministic in `seed`, until they hold `total` tokens: the last document is cut
// to fit, so it alone may be shorter than min_len. Sums to `total`.
std::vector<int64_t> packed_document_lengths(int64_t total, uint64_t seed, int64_t min_len = 128,
                                             int64_t max_len = 32768, double median = 1024, double sigma = 1.5);

}  // namespace cpf::cp
