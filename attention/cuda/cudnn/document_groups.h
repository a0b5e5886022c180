#pragma once
// thd calls split into groups of entries of similar lengths (private to cpf_attention_cuda; plain host
// logic, no CUDA or cuDNN types).
//
// cuDNN sizes a thd call by its LONGEST entry: Stats (b, h, s_q), the backward's fp32 dQ accumulator
// (b, h, s_q, d) and row sums (b, h, s_q), and grids of b x ceil(s / 128) tiles per head, where s is
// that entry's length rounded up to 128. Packed documents of long-tailed lengths make this many times
// the real tokens: gpu_cp_bench --thd-plan shows b x s_q = 10.6 x the query tokens in every call of
// the packed-documents case (85 documents, two of 32k tokens), 21 GiB of dQ accumulator zeroed per
// one-GPU backward at h 16, d 128, and the same per rank under p2p (four ring tiles of 2.7-5.3 GiB).
//
// The entries of a ragged mapping can run as several cuDNN executions over the same tensors: ragged
// offsets address the packed storage, so each execution reads and writes only its own entries' rows,
// and the band constants the mapping chose hold for every subset of its entries. Grouping entries of
// similar padded lengths brings the buffers and grids back to about the real tokens, at the cost of one
// execution (and its plan: keys differ by b and s) per group.
//
//   entries (rounded q lengths):  32768 32768 21248 10624 8192 ... 256 128 128
//   one call:     b = 85, s_q = 32768                    -> 2.79 M rows
//   groups:       {32768 x 2} {21248} {10624 ... 8192} ... {1024 ... 128}  -> Σ b_g s_g near the tokens
#include <cstdint>
#include <vector>

#include "attention/cuda/cudnn/problem_mapping.h"

namespace cpf::attention_cuda::cudnn {

// What one more execution is worth, in rows of the (b, h, s) buffers (a row costs about h x d x 4 bytes
// of dQ accumulator to zero, the execution its launches and host work): an estimate, to be measured.
inline constexpr int64_t kGroupCallRows = 16384;

struct SdpaGroup {
  std::vector<int64_t> entries;  // indices of the mapping's entries, in their order
  int64_t s_q = 0, s_kv = 0;     // the group's longest entry, rounded up to 128
};

// Rows of the (b, h, s) buffers of a call: b x (s_q + s_kv) (the q-side buffers and the backward's
// grid over keys).
int64_t sdpa_rows(int64_t b, int64_t s_q, int64_t s_kv);

// Groups of the mapping's entries minimising Σ sdpa_rows(b_g, s_q_g, s_kv_g) + call_rows x groups
// (exact: a dynamic programme over the distinct rounded (q, kv) lengths, sorted by their sum, grouping
// consecutive ones). One group of every entry, in order, for a mapping that is not ragged, has a
// reason, or gains nothing from a split. Throws for call_rows < 0.
std::vector<SdpaGroup> group_entries_by_length(const SdpaMapping& m, int64_t call_rows = kGroupCallRows);

// The mapping of one group's execution: its entries (lengths, first tokens) and s dims, the parent's
// band and flags. The undefined-row flags are left empty: they describe the whole call, whose fix-ups
// run once after every group.
SdpaMapping group_mapping(const SdpaMapping& m, const SdpaGroup& group);

}  // namespace cpf::attention_cuda::cudnn
