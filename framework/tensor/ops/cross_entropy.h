#pragma once
// Softmax cross-entropy over class logits (non-differentiable kernels; cpf::cross_entropy in
// framework/autograd/functions/nn.h wraps them). The forward keeps only the per-row log-sum-exp,
// never a (N, C) probability tensor: the backward recomputes softmax = exp(logits - lse) on the fly.
#include "framework/tensor/tensor.h"

namespace cpf::raw {

struct CrossEntropyResult {
  Tensor loss;              // scalar: mean of lse - logits[target] over rows whose target is not ignored
  Tensor lse;               // (N): log-sum-exp of every row (ignored rows included)
  int64_t valid_count = 0;  // rows whose target is not ignore_index; -1 on a device (see count)
  // The same count as a scalar i64 on logits' device. A device computes loss and count without waiting
  // for the GPU, so it leaves valid_count at -1: read count (a synchronisation) or pass it to the
  // backward overload below.
  Tensor count;
};

// logits (N, C) floating, targets (N) i32 or i64 with values in [0, C) or equal to ignore_index.
// loss and lse are f32 for f32/bf16 logits and f64 for f64 logits; the loss is 0 (not NaN) when every
// target is ignored. A target outside [0, C) throws naming the target, its row and C (on a device: at the
// next call that waits for it, see framework/tensor/cuda/cuda.h).
CrossEntropyResult cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100);

// d loss / d logits = (softmax(logits) - onehot(target)) * grad_loss / valid_count on valid rows, 0 on
// ignored rows (everywhere when valid_count is 0). grad_loss is a one-element tensor (the loss
// gradient); lse and valid_count come from the forward. The result has logits' dtype.
Tensor cross_entropy_backward(const Tensor& grad_loss, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              int64_t valid_count, int64_t ignore_index = -100);
// The same with the count as a tensor (CrossEntropyResult::count): on a device, grad_loss / count is
// formed there, so the call does not wait for the GPU.
Tensor cross_entropy_backward(const Tensor& grad_loss, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              const Tensor& count, int64_t ignore_index = -100);

// Checks on targets' device, without waiting for it, that every target is in [0, classes) or equals
// ignore_index; a bad one is raised at the next synchronisation, naming `op` (a string literal: the
// message is built after the call returns), the target and its row. Shared by every op taking class
// targets on a device (cross_entropy, classifier_loss).
void check_targets_on_device(const Tensor& targets, int64_t classes, int64_t ignore_index, const char* op);

}  // namespace cpf::raw
