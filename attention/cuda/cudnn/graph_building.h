#pragma once
// The cuDNN 9.19 composite SDPA graphs (docs/attention.md, "GPU attention: cuDNN"): matmul,
// pointwise, reduction and reshape ops that cuDNN's pattern matcher fuses into one flash-attention
// kernel, forward (always with the fp32 Stats branch: without it 9.19 offers no engine) and backward.
// Private to cpf_attention_cuda.
//
// Every I/O tensor is logically (b, h, s, d); layouts (bshd, sbhd, thd) are strides only. The data
// type is a parameter: bf16 today, f16 is one DType mapping away (attention/cuda/cudnn/fused_attention.cpp,
// io_data_type).
#include <array>
#include <compare>
#include <cstdint>
#include <memory>
#include <string>

#include "attention/cuda/cudnn/backend_api.h"

namespace cpf::attention_cuda::cudnn {

// Variant-pack uids of the non-virtual tensors.
enum SdpaUid : int64_t {
  kUidQ = 1,
  kUidK,
  kUidV,
  kUidO,
  kUidStats,
  kUidScale,
  kUidNegInf,
  kUidDout,
  kUidDq,
  kUidDk,
  kUidDv,
  kUidOne,
  kUidSoftmaxSum,
  kUidDqAccum,
  kUidSeqLenQ,
  kUidSeqLenKv,
  kUidOffsetQ,
  kUidOffsetK,
  kUidOffsetV,
  kUidOffsetO,
  kUidRightBound,
  kUidLeftBound,
  kUidSink,  // (1, h_q, 1, 1) f32: the attention sink of each query head
  // The FP8 forward's (SdpaGraphKey::fp8) scales and amaxes: (1, 1, 1, 1) f32 device tensors.
  kUidDescaleQ,
  kUidDescaleK,
  kUidDescaleV,
  kUidDescaleS,
  kUidScaleS,
  kUidScaleO,
  kUidAmaxS,
  kUidAmaxO,
  // The FP8 backward's besides those (and the forward's K, V, O, Stats, dO, dQ, dK, dV uids).
  kUidDescaleO,
  kUidDescaleDout,
  kUidDescaleDp,
  kUidScaleDp,
  kUidScaleDq,
  kUidScaleDk,
  kUidScaleDv,
  kUidAmaxDp,
  kUidAmaxDq,
  kUidAmaxDk,
  kUidAmaxDv,
};

using Strides4 = std::array<int64_t, 4>;  // (b, h, s, d) element strides

// Everything a plan depends on. Values passed by value at execution (scale, window bounds) and the
// device buffers (lengths, offsets) are not part of it.
struct SdpaGraphKey {
  bool backward = false;
  int device = 0;
  int io_type = CUDNN_DATA_BFLOAT16;  // cudnnDataType_t of Q, K, V, O (and dO, dQ, dK, dV)
  int64_t b = 0, h_q = 0, h_kv = 0, s_q = 0, s_kv = 0, d_qk = 0, d_v = 0;
  Strides4 q{}, k{}, v{}, o{};  // backward: o is also dO's, q/k/v also dQ/dK/dV's
  bool padding = false;         // seq_len tensors: padding mask + matmul M/N/K overrides
  bool ragged = false;          // thd: ragged offsets on Q, K, V, O
  bool ragged_int64 = false;    // INT64 offsets (element offsets may exceed 2^31)
  bool right_bound = false;     // keep row + r >= col (r by value; bottom_right adds seq_len_kv - seq_len_q)
  bool right_shift = false;     // r != 0 (an extra ADD, as cudnn-frontend emits only then)
  bool left_bound = false;      // keep col + w > row (w by value; bottom_right subtracts seq_len_kv - seq_len_q)
  bool bottom_right = false;    // diagonal offset per batch from the seq_len tensors (needs padding)
  bool deterministic = false;   // backward: dQ written directly (dP workspace) instead of an fp32 accumulator
  bool sink = false;            // forward: the attention sink joins the softmax (cuDNN 9.13+, attention_sink.h)
  // The forward in FP8 (attention/cuda/cudnn_fp8_forward.h): Q, K, V and O E4M3 with per-tensor scales, the
  // probabilities cast to E4M3 before their matmul, their amax and O's recorded. No mask or the causal
  // one (right_bound without shift) only. With backward (cudnn_fp8_backward.h): dO, dP and the gradients
  // in fp8_grad_type (a cudnnDataType_t, E5M2 or E4M3) with their own scales and amaxes.
  bool fp8 = false;
  int fp8_grad_type = 0;

  auto operator<=>(const SdpaGraphKey&) const = default;
  std::string str() const;  // "fwd b=2 hq=16 hkv=16 sq=1024 ..." for reasons and logs
};

// The plan for `key`, or nullptr with *failure set when cuDNN offers no engine that finalizes.
// Throws cpf::Error when cuDNN rejects the graph's description itself (a bug here, not a limit).
std::unique_ptr<ExecutionPlan> build_sdpa_plan(const SdpaGraphKey& key, cudnnHandle_t handle, std::string* failure);

}  // namespace cpf::attention_cuda::cudnn
