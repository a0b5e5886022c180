#pragma once
// cuDNN's FP8 flash-attention forward, to measure before FP8 attention joins training (#32: attention
// stays bf16 "unless cuDNN's FP8 SDPA proves equal on the loss curve: measure and decide"; docs/fp8.md,
// "FP8 attention"). Not used by the attention ops yet: tests/attention/cuda/cudnn_fp8_test.cpp holds it to
// the bf16 attention of the same values, benchmarks/gpu/fp8_attention_bench.cpp times it against bf16.
//
//   S = (Q K^T) * softmax_scale * descale_q * descale_k     Q, K in E4M3, the product in f32
//   P = softmax(causal(S))                                   stats = max + log(sum) per row, f32
//   amax_s = max P;  P8 = E4M3(P * scale_s)
//   O = (P8 V) * descale_s * descale_v;  amax_o = max |O|;  out = E4M3(O * scale_o)
//
// Compiles without CUDA or cuDNN; without cuDNN the call throws.
#include "framework/tensor/tensor.h"

namespace cpf::attention_cuda {

// () f32 tensors on the inputs' device. A descale is the inverse of the scale its tensor was cast with.
struct Fp8AttentionScales {
  Tensor descale_q, descale_k, descale_v;
  Tensor scale_s, descale_s;  // the probabilities' scale (P in [0, 1]: 448 maps 1 onto E4M3's largest)
  Tensor scale_o;             // the output's scale
};

struct Fp8AttentionForward {
  Tensor out;     // (B, S, H, D_v) f8e4m3: E4M3(O * scale_o)
  Tensor stats;   // (B, H, S, 1) f32: the rows' log-sum-exp of S, as the bf16 forward's
  Tensor amax_s;  // () f32: max P
  Tensor amax_o;  // () f32: max |O| before its scale
};

// q (B, S, H, D), k (B, S, H_kv, D), v (B, S, H_kv, D_v): contiguous bshd f8e4m3 on one CUDA device, H a
// multiple of H_kv; causal: the top-left causal mask (row >= column), else none. Throws cpf::Error naming
// the reason when the inputs do not fit, this build has no cuDNN, or cuDNN offers no engine for the shape.
Fp8AttentionForward cudnn_fp8_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                                const Fp8AttentionScales& scales, double softmax_scale, bool causal);

}  // namespace cpf::attention_cuda
