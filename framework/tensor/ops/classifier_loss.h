#pragma once
// The fused classifier: LM head, softmax cross-entropy and the gradients of both in one op, over row
// chunks, so the (T, V) logits never exist whole in any dtype (non-differentiable kernels;
// cpf::classifier_loss in framework/autograd/functions/classifier_loss.h wraps them).
//
// For each chunk of R rows (a view of hidden (R, C)):
//   logits (R, V) = hidden_chunk @ weight^T                        one GEMM (raw::matmul)
//   one pass over each row: its loss, and dlogits = (softmax - onehot(label)) * scale written over the
//     logits in their dtype (f32 math for bf16)                   DeviceOps::classifier_rows
//   dhidden_chunk (R, C) = dlogits @ weight                        one GEMM
//   dweight (V, C) += dlogits^T @ hidden_chunk                     one GEMM (raw::linear_param_grads), summed
//                                                                  in place (beta = 1), in f32 for bf16
// with scale = 1 / divisor: the gradients of the returned loss, i.e. for an incoming loss gradient of 1.
// Memory beyond the inputs: one (R, V) chunk, dhidden (T, C) and dweight (V, C) in the compute dtype
// (f32 for bf16) and (T) f64 row losses.
#include "framework/tensor/tensor.h"

namespace cpf {

// In namespace cpf (not raw) so that calls of cpf::classifier_loss do not also find the raw op by
// argument-dependent lookup.
struct ClassifierLossOptions {
  int64_t ignore_index = -100;
  // The summed row losses are divided by this: the valid-label count over every rank that shares the
  // step (so summing the ranks' losses gives their mean). 0 = this call's valid-label count (the mean;
  // on a device the labels are then read back once to count them).
  int64_t normalizer = 0;
  // The same normalizer as a () f64 tensor on the hidden's device (normalizer must then be >= 1 too: the
  // host's checks and `divisor` use it). The kernels read the divisor from it instead of taking it as an
  // argument, so a captured CUDA graph (apps/trainer/step/step_graph.h) divides by the count written there
  // before each replay. Undefined: `normalizer` alone.
  Tensor normalizer_tensor;
  // Rows per chunk; 0 = chosen by memory: the fewest chunks whose (rows, V) logits each fit
  // raw::kClassifierChunkBytes, all of one size (a multiple of 128; the last may be shorter).
  int64_t chunk_rows = 0;
  // false: the loss only (no dlogits, no gradient GEMMs), e.g. under NoGradGuard.
  bool compute_grads = true;
};

}  // namespace cpf

namespace cpf::raw {

// The chunk size classifier_chunk_rows aims for: the logits of one chunk in the logits' dtype.
// 1 GiB: short chunks make the three GEMMs less efficient (docs/training.md, "The LM head and the loss",
// has the measurements), and 1 GiB is still about a third of GPT-2's whole bf16 logits (32768 x 50304).
inline constexpr int64_t kClassifierChunkBytes = int64_t(1) << 30;

struct ClassifierLossResult {
  Tensor loss;             // scalar: f32 for f32/bf16 inputs, f64 for f64
  Tensor dhidden;          // (T, C) d loss / d hidden, in the compute dtype (f32 for bf16); undefined without grads
  Tensor dweight;          // (V, C) d loss / d weight, in the compute dtype (f32 for bf16); undefined without grads
  int64_t divisor = 0;     // what the summed loss was divided by (>= 1)
  int64_t chunk_rows = 0;  // the chunk size used
};

// The rows per chunk for `options.chunk_rows` (0 = chosen by memory) at (rows, vocab) in `dtype`.
int64_t classifier_chunk_rows(int64_t requested, int64_t rows, int64_t vocab, DType dtype);

// hidden (T, C) and weight (V, C) floating of one dtype and device, labels (T) i32/i64 with values in
// [0, V) or equal to ignore_index. loss = sum over valid rows of (lse - logits[label]) / divisor, 0 when
// every label is ignored. A label outside [0, V) throws naming it, its row and V (on a device: at the
// next call that waits for it, see framework/tensor/cuda/cuda.h).
ClassifierLossResult classifier_loss(const Tensor& hidden, const Tensor& weight, const Tensor& labels,
                                     const ClassifierLossOptions& options = {});

}  // namespace cpf::raw
