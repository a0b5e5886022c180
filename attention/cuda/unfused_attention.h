#pragma once
// The unfused CUDA attention path: everything the CPU reference (attention/cpu) supports, for CUDA
// tensors. Header without CUDA (tests call it directly to force small chunks).
//
// Per sequence, per chunk of (kv heads x query rows) and per query head j of each GQA group:
//   S  = scale * Q K^T                cuBLASLt, batched over the chunk's kv heads     (rows, s_kv)
//   P  = softmax(mask(S)), lse        one block per row; reads the per-token positions and the window
//   O  = P V                          cuBLASLt, written into out's rows in place
// Backward, from the saved lse (P is recomputed, never stored between calls):
//   D  = rowsum(dO * O) - dlse        one warp per row
//   dP = dO V^T,  dS = P * (dP - D)   (the kernel makes P and dS from S and dP)
//   dV += P^T dO,  dQ = scale dS K,  dK += scale dS^T Q
// dK/dV of a kv head are summed over its query heads by successive GEMMs with beta = 1 on one
// stream, so every run gives bitwise the same result (deterministic by construction, no atomics).
//
// Precision: f32 and f64 compute in their own type (f32 GEMMs on TF32 only after
// cuda::set_allow_tf32(true)); bf16 converts Q, K, V (and dO, O) to f32 once and computes in f32 like
// the CPU reference, its GEMMs on TF32 tensor cores with f32 accumulation: bf16 values are exact in
// TF32, only P and dS are rounded to TF32 (2^-11 relative), well below the bf16 rounding of the
// results. lse is f32 (f64 for f64); softmax and row sums are f32/f64. Memory beyond inputs and outputs:
// the f32 copies for bf16 and at most `workspace_bytes` of score buffers (one in the forward, two in
// the backward), so long sequences are processed in row chunks instead of running out of memory.
#include <cstddef>

#include "attention/attention_op.h"
#include "attention/attention_problem.h"
#include "framework/tensor/tensor.h"

namespace cpf::attention_cuda::unfused {

struct Options {
  size_t workspace_bytes = size_t(1) << 30;  // bound on the score buffers of one call
};

// Contract of raw::attention_forward/backward (attention_op.h) for CUDA tensors in any layout the
// problem describes; runs on the calling thread's current stream. TileStats are not counted (zero).
raw::AttentionForward forward(const AttentionProblem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Options& options = {});
// dlse may be undefined.
raw::AttentionGrads backward(const AttentionProblem& p, const Tensor& dout, const Tensor& dlse, const Tensor& q,
                             const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                             const Options& options = {});

}  // namespace cpf::attention_cuda::unfused
