#pragma once
// How one AttentionProblem maps onto cuDNN's index-based SDPA (private to cpf_attention_cuda; no
// CUDA or cuDNN types, so it is plain host logic).
//
// cuDNN sees `b` sequences of (b, h, s, d) tensors: for bshd/sbhd the batch rows (strides), for thd
// the non-empty sequences (ragged offsets into the packed tokens). Its masks compare row and column
// indices: padding (row < seq_len_q[i], col < seq_len_kv[i]), a right bound row + r (+ seq_len_kv[i]
// - seq_len_q[i] when bottom-right aligned) >= col and a left bound col + w (- seq_len_kv[i] +
// seq_len_q[i]) > row. The problem's mask is position based: a query at position i sees a key at
// position j of its sequence iff i - left <= j <= i + right. With contiguous positions q0 + row and
// k0 + col that is row + (q0 - k0) + right >= col and col > row + (q0 - k0) - left - 1, so
//   r = c + right,  w = left - c + 1
// where c = q0 - k0 is the same for every sequence (top-left) or c = q0 - k0 - (kv_len - q_len) is
// (bottom-right). Anything else is not expressible and gets a reason.
#include <cstdint>
#include <string>
#include <vector>

#include "attention/attention_problem.h"

namespace cpf::attention_cuda::cudnn {

struct SdpaMapping {
  std::string reason;  // non-empty: cuDNN cannot express this call (the rest is then meaningless)

  int64_t b = 0;              // cuDNN batch: rows (bshd/sbhd) or non-empty sequences (thd)
  int64_t s_q = 0, s_kv = 0;  // cuDNN's s dims: the row lengths, or (thd) the longest sequence rounded up
  std::vector<int32_t> seq_len_q, seq_len_kv;  // per cuDNN batch entry
  std::vector<int64_t> q_token, kv_token;      // storage token of each entry's first query / key

  bool padding = false;  // pass seq_len tensors (padding mask + matmul overrides)
  bool ragged = false;   // thd
  bool right_bound = false, left_bound = false, bottom_right = false;
  int64_t right = 0;  // r above (only when right_bound)
  int64_t left = 0;   // w above (only when left_bound)

  // Storage tokens whose outputs cuDNN does not define: queries outside every cuDNN sequence or with
  // no visible key (out 0, lse -inf, dq 0), keys outside every cuDNN sequence (dk, dv 0). Empty when
  // there are none, else one flag per storage token (flattened row * row_len + col).
  std::vector<uint8_t> q_undefined, kv_undefined;
  bool any_fully_masked_row = false;  // some query of a sequence sees no key (its lse is -inf)
};

// Maps `p` (validated by check_attention_inputs). Never throws for inexpressible calls: `reason` says
// why instead. When the s_kv index dimension is 64 modulo 128 the padding form is used even without
// padding: cuDNN 9.19's Hopper backward otherwise reads an unmasked out-of-bounds tile and overflows
// exp(0 - lse) to NaN for rows with lse < -88.7 (docs/attention.md, "GPU attention: cuDNN").
SdpaMapping map_to_cudnn(const AttentionProblem& p);

}  // namespace cpf::attention_cuda::cudnn
