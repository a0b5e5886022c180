#pragma once
// A linear layer whose three GEMMs run in FP8 with per-tensor scales, by either recipe of fp8_scaling.h:
// current scaling (each tensor's scale from its own amax, computed right before its cast), or delayed
// scaling when the options carry a slot (the scales of earlier steps; the casts record this step's amax).
//
//   forward   y  = (x_q * s_x^-1) (W_q * s_w^-1)^T + b      x, W in E4M3
//   backward  dX = dY_q W_q                                   dY in E5M2 (the range gradients need)
//             dW = dY_q^T X_q                                 the FP8 copy of x kept by the forward
//             db = column sums of dY (f32)
//
// Accumulation is f32; y and dX are bf16, dW and db are of the weight's dtype (f32 master weights get f32
// gradients straight from the GEMM). The forward keeps x only as its FP8 transposed copy (1 byte an
// element instead of 2). What stays out of FP8 is the caller's: embeddings, the LM head, norms and
// attention are not linears of this kind. On CUDA the rows of x (the tokens) and both dims of W must
// be multiples of 16 (cuBLASLt's FP8 layouts).
#include <cstdint>
#include <optional>

#include <vector>

#include "framework/autograd/fp8_scaling.h"
#include "framework/tensor/ops/fp8_activation.h"
#include "framework/tensor/tensor.h"

namespace cpf {

class Fp8WeightCache;

struct Fp8LinearOptions {
  // Headroom: scales are fp8_max / amax / 2^margin (framework/tensor/ops/fp8.h, fp8_scale).
  int64_t margin = 0;
  // Delayed scaling: this call site's state (Fp8ScalingState::slot); nullopt = current scaling.
  std::optional<Fp8Slot> slot;
  // The step's kept FP8 weight copies (framework/autograd/fp8_weight_cache.h), or null: cast at every call.
  Fp8WeightCache* weight_cache = nullptr;
  // The forward GEMM with cuBLASLt's FP8 fast accumulation (raw::fp8_matmul_nt); the backward's two GEMMs
  // always promote their partial sums, as TransformerEngine's recipe does.
  bool fast_forward_accumulation = false;
  // For the callers that choose between fp8_linear_after and an activation then fp8_linear (nn::MLP,
  // gelu_mlp; fp8_autocast.h's fp8_fuse_activation_casts): whether to fuse. fp8_linear itself ignores it.
  bool fuse_activation_casts = true;
};

// x (..., K) bf16 @ weight (N, K)^T + bias (N) -> (..., N) bf16, the GEMMs in FP8 as above. weight and bias
// f32 or bf16 (one dtype), bias optional. Differentiable in x, weight and bias.
Tensor fp8_linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
                  const Fp8LinearOptions& options = {});

// The same with the weight given as row blocks (N_i, K) of one (sum N_i, K) weight, as linear_cat's parts:
// the FP8 copy is cast from their concatenation (or taken from the weight cache, keyed by the parts) and
// each part gets its rows of dW. bias (sum N_i) or undefined.
Tensor fp8_linear(const Tensor& x, const std::vector<Tensor>& weights, const Tensor& bias,
                  const Fp8LinearOptions& options);

// y = act(pre) W^T + b with the FP8 cast of the linear's input fused into the activation
// (framework/tensor/ops/fp8_activation.h): h = act(pre) is never written in bf16; its E4M3 codes and their
// transpose come from one pass over pre, with the values of casting act(pre) rounded to bf16. gelu: pre
// (..., K); swiglu: pre (..., 2 K) = [gate | up], h = silu(gate) * up. weight (N, K). The backward computes
// dH (M, K) with the FP8 GEMM and d_pre from it and the kept pre (bf16, what the activation op would keep).
// Differentiable in pre, weight and bias.
Tensor fp8_linear_after(raw::CastActivation activation, const Tensor& pre, const Tensor& weight, const Tensor& bias,
                        const Fp8LinearOptions& options);

}  // namespace cpf
