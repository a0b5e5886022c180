#pragma once
// AttentionProblem: one attention call after validation, in the terms every kernel needs: shapes,
// the sequences as (row, column, length) ranges of the storage, per-token positions, the window and
// the scale. check_attention_inputs() is the single place where inputs are validated; it runs
// before any work and throws with the offending values.
#include <cstdint>
#include <optional>
#include <vector>

#include "attention/attention_backend.h"
#include "attention/sequence_info.h"
#include "attention/spec.h"
#include "framework/tensor/tensor.h"

namespace cpf {

// How the CPU backward distributes work over threads.
enum class BackwardSchedule : uint8_t {
  automatic,   // by_kv_head when there are enough (sequence, kv head) pairs to keep every thread busy
  by_kv_head,  // one task per (sequence, kv head): dq, dk, dv in one sweep
  split,       // dk/dv per (sequence, kv head, kv block), then dq per (sequence, head, q block)
};

// Tile sizes and scheduling of the CPU kernels (defaults are what the benchmark measured best), and
// the kernel choice for CUDA tensors.
struct AttentionKernelConfig {
  int64_t block_q = 64;
  int64_t block_kv = 64;
  BackwardSchedule backward = BackwardSchedule::automatic;
  // CUDA tensors: which kernels run the call (attention_backend.h), and whether the backward must be
  // bitwise reproducible (cuDNN: the dP-workspace path, O(b h s_q s_kv) memory; unfused: always is).
  AttentionBackend backend = AttentionBackend::automatic;
  bool deterministic = false;
};

struct AttentionSequence {
  int64_t q_row = 0, q_col = 0, q_len = 0;  // batch row (0 for thd) and index within it
  int64_t kv_row = 0, kv_col = 0, kv_len = 0;
  int64_t q_token = 0, kv_token = 0;  // flattened storage index (row * row length + col)
};

struct AttentionProblem {
  QkvFormat format = QkvFormat::bshd;
  int64_t batch = 1;          // 1 for thd
  int64_t s_q = 0, s_kv = 0;  // row lengths (thd: total tokens)
  int64_t h_q = 0, h_kv = 0, d_qk = 0, d_v = 0;
  double scale = 1.0;
  AttentionWindow window;  // effective: right = 0 under causal masks
  std::vector<AttentionSequence> sequences;
  std::vector<int64_t> q_pos, kv_pos;  // per storage token
  AttentionKernelConfig config;
  Tensor sink;  // spec.sink (undefined = none): kernels may apply it natively (AttentionForward::sink_applied)

  int64_t group() const { return h_q / h_kv; }
  // Element offset of token (row, col), head `head`, dim 0 in a contiguous tensor of this format with
  // rows of `row_len` tokens and `heads` x `dim` per token; consecutive tokens of a row are
  // token_stride() apart.
  int64_t element_offset(int64_t row, int64_t col, int64_t row_len, int64_t head, int64_t heads, int64_t dim) const {
    const int64_t token = format == QkvFormat::sbhd ? col * batch + row : row * row_len + col;
    return (token * heads + head) * dim;
  }
  int64_t token_stride(int64_t heads, int64_t dim) const {
    return (format == QkvFormat::sbhd ? batch : 1) * heads * dim;
  }
  // Offset of (row, head, col) in the lse tensor: (batch, h_q, s_q), or (h_q, t) for thd.
  int64_t lse_offset(int64_t row, int64_t head, int64_t col) const { return (row * h_q + head) * s_q + col; }

  // Shapes of the outputs.
  Shape out_shape() const;
  Shape lse_shape() const;
};

// Validates q, k, v against the spec and the sequence info (or the default: one whole sequence per
// bshd/sbhd row) and resolves them. `op` prefixes every message.
AttentionProblem check_attention_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionSpec& spec,
                                        const std::optional<SequenceInfo>& seq, const AttentionKernelConfig& config,
                                        const char* op = "dot_product_attention");

}  // namespace cpf
