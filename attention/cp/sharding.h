#pragma once
// Load-balanced ("dual-chunk") sequence sharding for context parallelism.
//
// A sequence of length S (a multiple of 2P) is cut into 2P chunks of c = S / 2P tokens. Rank r holds
// chunks r and 2P-1-r, in that order, so causal work is balanced: early and late chunks pair up.
//
//   P = 2, S = 8:  tokens  0 1 | 2 3 | 4 5 | 6 7        chunks C0 C1 C2 C3
//                  rank 0: C0 C3 = 0 1 6 7
//                  rank 1: C1 C2 = 2 3 4 5
//
// THD (packed variable-length) batches shard every sequence this way: sequence i occupies padded
// storage [cu_seqlens_padded[i], cu_seqlens_padded[i+1]) whose length is a multiple of 2P; only the
// first cu_seqlens[i+1] - cu_seqlens[i] tokens of it are real. Rank r stores, per sequence, chunk r
// then chunk 2P-1-r, so its local padded offsets are cu_seqlens_padded / P. Real tokens per chunk
// follow the clamp formula: half 0 holds clamp(L - r c, 0, c), half 1 holds clamp(L - (2P-1-r) c, 0, c).
#include <array>
#include <cstdint>
#include <vector>

#include "framework/tensor/tensor.h"

namespace cpf::cp {

// The two global chunk ids rank `rank` holds: {rank, 2P-1-rank}.
std::array<int64_t, 2> dual_chunk_ids(int64_t cp_size, int64_t rank);

// Global positions (0..S-1) of the tokens rank `rank` holds, in local order. Throws when S is not a
// multiple of 2 * cp_size.
std::vector<int64_t> dual_chunk_positions(int64_t seq_len, int64_t cp_size, int64_t rank);

// One rank's share of a packed THD batch.
struct ThdShard {
  int64_t cp_size = 1;
  int64_t rank = 0;
  std::vector<int64_t> cu_seqlens_padded_local;  // global cu_seqlens_padded / P
  std::vector<int64_t> cu_seqlens_padded;        // global, as given
  std::vector<int64_t> cu_seqlens;               // global real lengths, as given
  // Per local token (length cu_seqlens_padded.back() / P):
  std::vector<int64_t> global_index;  // storage index in the global packed batch
  std::vector<int64_t> sequence;      // which sequence it belongs to
  std::vector<int64_t> position;      // position inside its sequence (padding included)
  std::vector<uint8_t> valid;         // 1 for a real token, 0 for padding
  // Real tokens per sequence in each local half (the clamp formula).
  std::vector<int64_t> real_first_half;
  std::vector<int64_t> real_second_half;
  int64_t local_tokens() const { return static_cast<int64_t>(global_index.size()); }
};

// Validates cu_seqlens (real, non-decreasing, starting at 0) against cu_seqlens_padded (same count,
// every padded length a multiple of 2P and >= the real length) and builds rank `rank`'s shard.
ThdShard thd_shard(const std::vector<int64_t>& cu_seqlens, const std::vector<int64_t>& cu_seqlens_padded,
                   int64_t cp_size, int64_t rank);

// Pads real lengths up to multiples of 2P: returns cu_seqlens_padded for the given cu_seqlens.
std::vector<int64_t> pad_cu_seqlens(const std::vector<int64_t>& cu_seqlens, int64_t cp_size);

// ---- tensor helpers (copies; used by the data loader and the tests) ----

// The rank's dual-chunk slice along `seq_dim` (bshd: 1, sbhd: 0).
Tensor shard_sequence(const Tensor& t, int64_t seq_dim, int64_t cp_size, int64_t rank);
// Inverse of shard_sequence over all ranks' shards (shards[r] from rank r).
Tensor unshard_sequence(const std::vector<Tensor>& shards, int64_t seq_dim);
// The rank's tokens of a packed (T, ...) tensor, in local order.
Tensor shard_tokens(const Tensor& t, const ThdShard& shard);
// Inverse of shard_tokens: scatters every rank's tokens back into a (T, ...) tensor of zeros.
Tensor unshard_tokens(const std::vector<Tensor>& shards, const std::vector<ThdShard>& infos);

// Reorders P pieces of 2 chunks each, concatenated in rank order along `dim` (what an all-gather
// returns), into sequence order C0 C1 ... C_{2P-1}; and back.
Tensor rank_order_to_sequence_order(const Tensor& t, int64_t dim, int64_t cp_size);
Tensor sequence_order_to_rank_order(const Tensor& t, int64_t dim, int64_t cp_size);

}  // namespace cpf::cp
