#pragma once
// SequenceInfo: where the sequences of an attention call lie and what positions their tokens have.
//
// Storage is addressed along one flattened token axis: for thd the t dim; for bshd and sbhd the
// (batch, seq) pair as b * s + i (whatever the memory layout). Sequence n's query tokens occupy
//   [cu_seqlens_q_padded[n], cu_seqlens_q_padded[n] + (cu_seqlens_q[n+1] - cu_seqlens_q[n]))
// of that axis; the rest of its slot, up to cu_seqlens_q_padded[n+1], is padding (TransformerEngine's
// cu_seqlens / cu_seqlens_padded pair; the last padded entry is the end of the storage). The same
// holds for keys/values with the _kv arrays. Tokens outside every sequence get out = 0, lse = -inf
// and zero gradients.
//
// Positions drive the mask (spec.h): by default a token's position is its index within its slot.
// Explicit per-token positions (one per storage token) replace that; position offsets are how a CP
// step asks for a diagonal, a full or a bottom-right tile.
//
//   thd, two sequences of 3 and 2 tokens, each padded to 4:   cu_seqlens   = [0, 3, 5]
//     storage: [a a a . b b . .]                              cu_seqlens_padded = [0, 4, 8]
#include <cstdint>
#include <string>
#include <vector>

#include "attention/spec.h"
#include "framework/tensor/tensor.h"

namespace cpf {

struct SequenceInfo {
  std::vector<int64_t> cu_seqlens_q{0};          // (n+1) cumulative real lengths
  std::vector<int64_t> cu_seqlens_kv{0};         // (n+1)
  std::vector<int64_t> cu_seqlens_q_padded{0};   // (n+1) storage start of each sequence; last = storage end
  std::vector<int64_t> cu_seqlens_kv_padded{0};  // (n+1)
  int64_t max_seqlen_q = 0;                      // upper bounds of the real lengths
  int64_t max_seqlen_kv = 0;
  std::vector<int64_t> q_positions;   // one per storage token, or empty: index within the slot
  std::vector<int64_t> kv_positions;  // one per storage token, or empty

  int64_t num_sequences() const { return static_cast<int64_t>(cu_seqlens_q.size()) - 1; }
  int64_t q_length(int64_t n) const { return cu_seqlens_q[n + 1] - cu_seqlens_q[n]; }
  int64_t kv_length(int64_t n) const { return cu_seqlens_kv[n + 1] - cu_seqlens_kv[n]; }
  int64_t q_start(int64_t n) const { return cu_seqlens_q_padded[n]; }
  int64_t kv_start(int64_t n) const { return cu_seqlens_kv_padded[n]; }
  int64_t q_storage_tokens() const { return cu_seqlens_q_padded.back(); }
  int64_t kv_storage_tokens() const { return cu_seqlens_kv_padded.back(); }

  // Per storage token: the explicit positions, or the index of each token within its slot (tokens
  // before the first slot get 0).
  std::vector<int64_t> resolved_q_positions() const;
  std::vector<int64_t> resolved_kv_positions() const;

  // Real lengths; each sequence occupies a slot of `slot` tokens (the bshd/sbhd row length, or a
  // fixed thd padding), or exactly its length when slot = 0 (packed thd).
  static SequenceInfo from_lengths(const std::vector<int64_t>& q_lengths, const std::vector<int64_t>& kv_lengths,
                                   int64_t q_slot = 0, int64_t kv_slot = 0);
  static SequenceInfo from_lengths(const std::vector<int64_t>& lengths, int64_t slot = 0);  // self-attention
  // Cumulative real lengths plus storage offsets (an empty padded array = packed: equal to cu_seqlens).
  static SequenceInfo from_cu_seqlens(const std::vector<int64_t>& cu_seqlens_q,
                                      const std::vector<int64_t>& cu_seqlens_kv,
                                      const std::vector<int64_t>& cu_seqlens_q_padded,
                                      const std::vector<int64_t>& cu_seqlens_kv_padded);
  static SequenceInfo from_cu_seqlens(const std::vector<int64_t>& cu_seqlens,
                                      const std::vector<int64_t>& cu_seqlens_padded = {});

  // Per-token segment ids (>= 1; 0 = padding) and positions within the segment, as i32/i64 tensors.
  // segment_pos has shape (rows..., len); segment_ids has that shape or extra leading batch dims,
  // over which segment_pos is broadcast (a batched call: the leading dims become more rows).
  // Storage token r * len + i is row r, index i. Each run of a nonzero id within a row is one
  // sequence; q and kv sequences pair up by id within a row. Lengths and offsets count only tokens
  // that see (or are seen by) at least one token of the other side under spec's mask and window, so
  // a sequence starts at its first visible token. bshd/sbhd hold at most one sequence per row, and
  // without a padding mask every row is one whole sequence. Defined in segment_ids.cpp.
  static SequenceInfo from_segment_ids(const AttentionSpec& spec, const Tensor& q_segment_ids,
                                       const Tensor& q_segment_pos, const Tensor& kv_segment_ids,
                                       const Tensor& kv_segment_pos);
  static SequenceInfo from_segment_ids(const AttentionSpec& spec, const Tensor& segment_ids, const Tensor& segment_pos);

  // A copy whose tokens have positions offset + (index within the slot): one offset for every
  // sequence, or one per sequence (e.g. q offset = kv_length - q_length aligns a tile bottom-right).
  SequenceInfo with_position_offsets(int64_t q_offset, int64_t kv_offset) const;
  SequenceInfo with_position_offsets(const std::vector<int64_t>& q_offsets,
                                     const std::vector<int64_t>& kv_offsets) const;
  // A copy with explicit per-token positions (each empty or one per storage token).
  SequenceInfo with_positions(std::vector<int64_t> q_positions, std::vector<int64_t> kv_positions) const;

  // Throws unless the arrays describe non-overlapping, ordered sequences with consistent sizes.
  void check() const;
  std::string str() const;
};

}  // namespace cpf
