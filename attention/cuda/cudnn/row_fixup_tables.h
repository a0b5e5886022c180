#pragma once
// The row fix-up tables of one cuDNN mapping, made once per mapping and stream (private to
// cpf_attention_cuda; used by attention/cuda/cudnn/fused_attention.cpp).
//
// A thd call turns cuDNN's padded (b, h, s) Stats into the packed (h, T) lse and back through two
// index tables of one entry per token (from packed_to_padded and padded_to_packed; one gather each,
// attention/cuda/cudnn/row_fixups.h), and fills the rows cuDNN leaves undefined run by run (flag_runs). Built per call,
// that is two walks over the tokens, two tables of 8 bytes per token and a content-hashed device_table lookup of each,
// in every ring tile of every layer, forward and backward. The mapping itself is cached
// (attention/cuda/cudnn/problem_mapping_cache.h) and never changes, so these derived tables are kept with it instead.
//
// Keyed by the mapping object (the entry holds it: its address cannot be reused while the entry
// lives), the problem's format, lengths, heads and head dims (what the tables read besides the mapping),
// the device and the thread's current stream of it (a table is only read on the stream it was uploaded
// on). Per thread, the kRowTablesEntries most recently used. Never written after they are made.
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "attention/attention_problem.h"
#include "attention/cuda/cudnn/problem_mapping.h"
#include "framework/tensor/tensor.h"

namespace cpf::attention_cuda::cudnn {

inline constexpr size_t kRowTablesEntries = 32;

struct RowTables {
  // flag_runs(q_undefined / kv_undefined, kMaxFillRuns): empty when there are none or too many.
  std::vector<std::pair<int64_t, int64_t>> q_runs, kv_runs;
  // thd, i64 on the device (undefined otherwise): per packed token t, n * h_q * s_q + j for entry n's
  // j-th query (packed_lse's index; tokens outside every entry read 0), and padded_to_packed.
  Tensor lse_index;              // (T): the problem's s_q tokens
  Tensor stats_columns;          // (b * s_q): the mapping's b and s_q
  Tensor seq_len_q, seq_len_kv;  // padding: (b) i32 on the device (the mapping's); undefined otherwise
  // thd: the ragged offset tables of q, k, v, o (ragged_offsets) for the dense layouts' row strides
  // `offset_row_strides`, in i64 when `offsets_int64` else i32. A call whose layouts or plan key
  // differ (strided views) makes its own.
  std::array<int64_t, 4> offset_row_strides{};
  bool offsets_int64 = false;
  std::array<Tensor, 4> offsets;
};

// Element offsets of each entry's first token (token * row stride: strided views step over the other
// pieces of their rows), then the end of the storage: (b + 1) values, as an i64 or i32 CPU tensor.
Tensor ragged_offsets(const std::vector<int64_t>& first_token, int64_t total_tokens, int64_t row_stride, bool int64);

// The tables one execution of mapping `m` binds, without the lse and fix-up tables: the lengths
// (padding) and the dense layouts' ragged offsets (thd). Not cached here: attention/cuda/cudnn/grouped_execution.cpp
// keeps each group's with its own cache.
RowTables execution_tables(const SdpaMapping& m, const AttentionProblem& p, const Device& device);

// The tables of mapping `m` of problem `p` on `device` (a CPU device gives CPU tensors), from this
// thread's cache when the same mapping object was seen on this stream.
std::shared_ptr<const RowTables> row_tables(const std::shared_ptr<const SdpaMapping>& m, const AttentionProblem& p,
                                            const Device& device);

// Tables this thread built / served from its cache since it started (for tests).
struct RowTablesStats {
  uint64_t builds = 0, hits = 0;
};
RowTablesStats row_tables_stats();

}  // namespace cpf::attention_cuda::cudnn
