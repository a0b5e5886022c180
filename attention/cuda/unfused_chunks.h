#pragma once
// How the unfused attention path cuts a call into GEMM-sized pieces (host logic, no CUDA).
//
// A chunk is query rows [r0, r0 + rows) of one sequence under query heads g * G + j for the kv heads
// g in [g0, g0 + kv_heads), against the key columns [c0, c0 + cols) of that sequence. Its scores,
// (kv_heads, rows, cols), must fit the score buffer budget. Key columns that no row of the chunk can
// see are left out: when the window is bounded (causal, sliding) and the sequence's key positions do
// not decrease, the visible keys of a row block form one contiguous run, found by binary search on
// the positions; row blocks are then at most kSkipRowBlock rows so that a causal call computes about
// half the scores. A chunk whose rows see no key at all is skipped (its rows keep out = 0, lse = -inf).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>

#include "attention/attention_problem.h"

namespace cpf::attention_cuda::unfused {

inline constexpr int64_t kSkipRowBlock = 512;

struct Chunk {
  const AttentionSequence* seq = nullptr;
  int64_t g0 = 0, kv_heads = 0;  // kv heads [g0, g0 + kv_heads)
  int64_t r0 = 0, rows = 0;      // query rows of the sequence
  int64_t j = 0;                 // position of the query head inside each GQA group
  int64_t c0 = 0, cols = 0;      // key columns of the sequence
};

// Key columns [first, second) of sequence `s` that query rows [r0, r0 + rows) can see; the whole
// sequence unless the window is bounded and the key positions do not decrease.
std::pair<int64_t, int64_t> visible_columns(const AttentionProblem& p, const AttentionSequence& s, int64_t r0,
                                            int64_t rows);

// Elements of the largest chunk's scores: the size of each score buffer. `bytes_per_score` is the
// element size times the number of score buffers (1 forward, 2 backward); `budget` bounds their bytes
// (at least one row of one head is always allowed).
int64_t chunk_elements(const AttentionProblem& p, size_t bytes_per_score, size_t budget);

// Calls `fn` for every chunk that has visible keys, in a fixed order: sequences, kv-head blocks, row
// blocks, then j (so the dK/dV sums of one kv head always run in the same order).
void for_each_chunk(const AttentionProblem& p, size_t bytes_per_score, size_t budget,
                    const std::function<void(const Chunk&)>& fn);

}  // namespace cpf::attention_cuda::unfused
