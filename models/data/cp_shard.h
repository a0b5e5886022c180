#pragma once
// Context-parallel sharding in the loader: each CP rank keeps its dual-chunk share of the global batch
// (attention/cp/sharding.h; the layout is in docs/cp_design.md, "The dual-chunk layout").
//
//   thd:  every sequence's padded slot is cut into 2P chunks and rank r keeps chunks r and 2P-1-r
//         (cp::thd_shard / cp::shard_tokens); slots must be multiples of 2P, i.e. pad_multiple a
//         multiple of 2 * cp_size.
//   bshd: the seq dim (T) is cut the same way (cp::shard_sequence); T must be a multiple of 2P.
//
// Labels were computed on the global sequence, so a token whose successor lives on another rank still
// has the right label. Loss normalisation: divide the sum of every rank's local losses by
// global_num_valid_labels (the same on every rank of the CP group).
// cp_size = 1 returns the global batch unchanged (no padding requirement) with an identity shard: that of
// cp::thd_shard when every slot is even, else one whose first half is the whole slot.
#include <cstdint>
#include <vector>

#include "attention/cp/sharding.h"
#include "models/data/deprecated_namespace.h"
#include "models/data/packing.h"

namespace cpf::models::data {

struct LocalBatch {
  Layout layout = Layout::thd;
  int64_t cp_size = 1;
  int64_t cp_rank = 0;
  Tensor tokens;     // i64, thd: (T / P), bshd: (B, T / P)
  Tensor labels;     // like tokens
  Tensor positions;  // like tokens; global positions inside the sequence (thd) or row (bshd)
  // thd: the shard description (local cu_seqlens_padded, global indices, real tokens per half).
  cp::ThdShard thd;
  int64_t num_valid_labels = 0;         // on this rank
  int64_t global_num_valid_labels = 0;  // over the whole CP group (batch.num_valid_labels)
};

// Rank cp_rank's share of `batch`; throws when the batch's padding does not allow cp_size.
LocalBatch shard_for_rank(const Batch& batch, int64_t cp_size, int64_t cp_rank);

// The inverse of shard_for_rank over every rank's share (shards[r] from rank r): the global tokens,
// labels, positions, cu_seqlens, cu_seqlens_padded and num_valid_labels (documents stays empty).
Batch unshard_batch(const std::vector<LocalBatch>& shards);

}  // namespace cpf::models::data
