#pragma once
// Token layouts: which global tokens a piece of storage holds, and in what order.
//
// Every CP strategy works on a packed (thd) view of the batch: bshd rows become sequences whose
// padded length is the row length. A rank's local storage holds, per sequence, its two dual chunks
// (sharding.h). After an all-gather or an all-to-all, a storage holds the tokens of several ranks.
// A GroupLayout describes such a storage for an ordered group of CP ranks:
//
//   member-major order (what a gather/all-to-all produces):  [rank a: s0 s1 ...][rank b: s0 s1 ...]
//   sequence-major order (what attention needs):              [s0: a's, b's][s1: a's, b's] ...
//
// In sequence-major order every sequence is one contiguous slot whose real tokens come first, sorted
// by their index in the global slot (so a gathered sequence is one run that cuDNN's index-based masks
// express), and every token carries its true position inside the sequence: the global SequenceInfo's
// explicit q / kv positions when it has them (gaps, offsets), else that index. Attention masks by
// positions, so correctness does not depend on the order inside a slot: a diagonal, lower or upper
// ring tile, an all-gathered prefix and a Ulysses full sequence are all "this layout's queries
// against that layout's keys".
#include <cstdint>
#include <vector>

#include "attention/cp/sharding.h"
#include "attention/sequence_info.h"

namespace cpf::cp {

// The batch as CP sees it: global real and padded cumulative lengths (thd semantics), and the
// positions of its storage tokens when the caller gave explicit ones.
struct GlobalSequences {
  std::vector<int64_t> cu_seqlens;         // real lengths
  std::vector<int64_t> cu_seqlens_padded;  // storage slots, each a multiple of 2 * cp_size
  // One per global storage token (SequenceInfo::q_positions / kv_positions), or empty: a token's
  // position is its index within its slot. Every layout hands them on with the tokens.
  std::vector<int64_t> q_positions;
  std::vector<int64_t> kv_positions;
  int64_t num_sequences() const { return static_cast<int64_t>(cu_seqlens.size()) - 1; }
};

struct GroupLayout {
  std::vector<int> members;  // CP ranks, in member-major order
  // Per storage token in sequence-major order:
  std::vector<int64_t> global_index;  // token of the global packed batch
  std::vector<int64_t> slot_index;    // its index within its global slot: the storage order, whatever the positions
  // member-major index -> sequence-major index (apply with index_select on the member-major tensor
  // using `to_sequence_major`, and back with `to_member_major`).
  std::vector<int64_t> to_sequence_major;  // sequence-major position s holds member-major token to_sequence_major[s]
  std::vector<int64_t> to_member_major;    // member-major position m holds sequence-major token to_member_major[m]
  // thd sequence info of the sequence-major storage; q_positions / kv_positions are the tokens'
  // positions as queries / as keys (the global ones, or slot_index when none were given).
  SequenceInfo info;
  int64_t tokens() const { return static_cast<int64_t>(global_index.size()); }
  // True when member-major and sequence-major orders coincide (a single rank's own storage).
  bool identity_order() const;
};

GroupLayout make_group_layout(const GlobalSequences& global, int64_t cp_size, const std::vector<int>& members);

// Reorders the rows (dim 0) of a member-major tensor into sequence-major order and back.
Tensor to_sequence_major(const Tensor& member_major, const GroupLayout& layout);
Tensor to_member_major(const Tensor& sequence_major, const GroupLayout& layout);

// The query/key SequenceInfo for one attention call between two layouts (q side from `q`, kv side
// from `kv`): sequences pair up by index; positions are explicit on both sides.
SequenceInfo pair_sequence_info(const GroupLayout& q, const GroupLayout& kv);

// The query side of `info` split by runs of consecutive `run_keys` (one per query storage token; the
// layout's slot_index, or the positions themselves): element k keeps, in every sequence, only the k-th
// run of its real queries (the rest of the slot counts as padding: out 0, lse -inf, dq 0).
// A rank's own queries are two chunks, so against a gathered sequence they see keys along two
// diagonals; one call per run has one, which cuDNN's index-based masks express. The parts' results
// cover disjoint rows: merged (or, for gradients, summed) they are the result of the whole call.
std::vector<SequenceInfo> split_query_runs(const SequenceInfo& info, const std::vector<int64_t>& run_keys);
std::vector<SequenceInfo> split_query_runs(const SequenceInfo& info);  // run_keys = info.q_positions

// Whether any real query of `q` sees any real key of `kv` (same sequence, inside `window`). It compares
// the position ranges of runs of consecutive slot indices (the chunks): exact for the default positions,
// so a ring step that sees nothing is skipped entirely; with explicit positions a range is the hull of
// its chunk's positions, so "nothing visible" is still never wrong (the kernel masks the rest).
bool any_visible(const GroupLayout& q, const GroupLayout& kv, const AttentionWindow& window);

}  // namespace cpf::cp
