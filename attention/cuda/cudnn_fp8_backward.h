#pragma once
// cuDNN's FP8 flash-attention backward, the other half of cudnn_fp8_forward.h, to measure before FP8
// attention joins training (docs/fp8.md, "FP8 attention"). Not used by the attention ops yet:
// tests/attention/cuda/cudnn_fp8_test.cpp holds it to the bf16 backward of the same values,
// benchmarks/gpu/fp8_attention_bench.cpp times it against bf16.
//
//   D   = rowsum(dO * O) * descale_do * descale_o                 f32, one value per query row
//   P   = exp(S * softmax_scale * descale_q * descale_k - stats)   S = Q K^T recomputed, causal or not
//   dV  = (E4M3(P * scale_s))^T dO * descale_s * descale_do        then * scale_dv into the gradient type
//   dP  = (dO V^T * descale_do * descale_v - D) * P * softmax_scale; amax_dp; dP8 = fp8(dP * scale_dp)
//   dQ  = dP8 K * descale_dp * descale_k;  dK = dP8^T Q * descale_dp * descale_q   (each * its scale)
//
// On Hopper cuDNN runs it only for head dim 128 (both d_qk and d_v), dense bshd inputs, and FP8 gradients
// (bf16 gradients need Blackwell). Compiles without CUDA or cuDNN; without cuDNN the call throws.
#include "framework/tensor/tensor.h"

namespace cpf::attention_cuda {

// () f32 tensors on the inputs' device; a descale is the inverse of the scale its tensor was cast with.
struct Fp8AttentionBackwardScales {
  Tensor descale_q, descale_k, descale_v, descale_o;  // the forward's inputs and output
  Tensor descale_do;                                  // dO's
  Tensor scale_s, descale_s;                          // the probabilities', as in the forward
  Tensor scale_dp, descale_dp;                        // dP's (the scores' gradient)
  Tensor scale_dq, scale_dk, scale_dv;                // the gradients' output scales
};

struct Fp8AttentionBackward {
  Tensor dq, dk, dv;                          // shapes of q, k, v in the gradient type: fp8(grad * scale)
  Tensor amax_dp, amax_dq, amax_dk, amax_dv;  // () f32, each before its scale
};

// q (B, S, H, D), k and v (B, S, H_kv, D), out (B, S, H, D) f8e4m3 (the forward's), d_out (B, S, H, D) in
// grad_type (f8e5m2 or f8e4m3), stats (B, H, S, 1) f32 (the forward's): contiguous on one CUDA device, H a
// multiple of H_kv. Throws cpf::Error naming the reason when the inputs do not fit, this build has no cuDNN,
// or cuDNN offers no engine for the shape (on Hopper: a head dim other than 128).
Fp8AttentionBackward cudnn_fp8_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                                  const Tensor& d_out, const Tensor& stats,
                                                  const Fp8AttentionBackwardScales& scales, double softmax_scale,
                                                  bool causal);

}  // namespace cpf::attention_cuda
