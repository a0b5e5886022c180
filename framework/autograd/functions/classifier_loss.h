#pragma once
// The fused classifier as a differentiable op: the LM head, softmax cross-entropy and both gradients
// in one call over row chunks (framework/tensor/ops/classifier_loss.h), so the (T, V) logits never
// exist whole. The forward computes the gradients eagerly when grad mode is on and hidden or weight
// requires grad; the loss must then be the end of the graph: its backward scales the saved dhidden and
// dweight by the incoming loss gradient. Under NoGradGuard it computes the loss alone.
#include "framework/autograd/functions/linear.h"
#include "framework/tensor/ops/classifier_loss.h"
#include "framework/tensor/tensor.h"

namespace cpf {

// hidden (T, C), weight (V, C) of one floating dtype, labels (T) i32/i64 -> scalar loss: the summed
// cross-entropy of hidden @ weight^T over labels != ignore_index, divided by options.normalizer (0 = the
// valid-label count: the mean). f32 for f32/bf16 inputs, f64 for f64. Gradients arrive in the inputs'
// dtypes (dweight summed over the chunks in f32 for bf16).
Tensor classifier_loss(const Tensor& hidden, const Tensor& weight, const Tensor& labels,
                       const ClassifierLossOptions& options = {});

// The same with the head as a linear's weights (as autograd linear takes them): head.weight the master
// (V, C), of hidden's dtype or f32 beside bf16 hidden; head.compute_weight undefined or the master's
// values in hidden's dtype (read by the GEMMs, not differentiated: e.g. the step's cached bf16 copy);
// head.bias undefined. The master's gradient is written in its dtype from the chunks' f32 sum (no bf16
// rounding, no cast's backward); dhidden in hidden's dtype.
Tensor classifier_loss(const Tensor& hidden, const LinearWeights& head, const Tensor& labels,
                       const ClassifierLossOptions& options = {});

}  // namespace cpf
