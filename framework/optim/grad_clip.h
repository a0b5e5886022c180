#pragma once
// Gradient utilities applied between backward and Optimizer::step: the global L2 norm, clipping by
// it, and scaling (for gradient accumulation).
//
//   const double norm = optim::clip_grad_norm_(params, 1.0);
//   if (std::isfinite(norm)) optimizer.step(); else log_warn("skipping step: gradient norm ", norm);
//   optimizer.zero_grad();
//
// Parameters without a gradient are skipped everywhere. The norm is accumulated in f64 whatever the
// gradients' dtype, so it is the same number for f32 and bf16 copies of the same values up to
// rounding of the inputs, and cannot overflow for finite f32 gradients.
//
// Gradient accumulation over k micro-batches: backward adds into existing gradients, so either
// scale each micro-batch loss by 1/k before backward, or sum unscaled losses and call
// scale_grads_(params, 1.0 / k) (or 1 / total valid tokens for token-weighted means) once before
// clipping. Clip after accumulation, on the summed gradient.
#include <vector>

#include "framework/optim/optimizer.h"

namespace cpf::optim {

// sqrt(sum over parameters of sum(grad^2)); +inf or NaN when a gradient holds one.
double grad_norm(const NamedTensors& params);
double grad_norm(const std::vector<Tensor>& params);

// Computes the norm; when it exceeds max_norm (finite, > 0), multiplies every gradient in place by
// max_norm / (norm + 1e-6). Returns the norm before clipping. A non-finite norm is returned as is and
// no gradient is modified: the caller decides (usually: skip the step).
double clip_grad_norm_(const NamedTensors& params, double max_norm);
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm);

// grad *= factor (finite) for every parameter that has a gradient.
void scale_grads_(const NamedTensors& params, double factor);
void scale_grads_(const std::vector<Tensor>& params, double factor);

// The same norm and clipping decided where the gradients are, so a device step needs no read-back before
// its update is enqueued (docs/training.md, "Host synchronisation in a step"):
//
//   const Tensor sum_sq = optim::grad_sum_squares(params);      // (1) f64, on the gradients' device
//   optim::clip_grads_by_sum_squares_(params, sum_sq, 1.0);    // no read-back on a GPU
//   optimizer.step(sum_sq);                                    // skipped there when sqrt(sum) is not finite
//   ... read sum_sq back (asynchronously), then optimizer.commit(std::isfinite(std::sqrt(sum)));
//
// grad_norm(params) == std::sqrt(grad_sum_squares(params).item<double>()) bit for bit, and
// clip_grads_by_sum_squares_ leaves exactly the gradients clip_grad_norm_ leaves.

// (1) f64 on the parameters' device: the sum over parameters of sum(grad^2), accumulated as grad_norm
// does (one sum_squares launch on a GPU, nothing read back). Every parameter and gradient must be on one
// device (throws naming the two devices otherwise); no parameter: a CPU zero.
Tensor grad_sum_squares(const NamedTensors& params);
Tensor grad_sum_squares(const std::vector<Tensor>& params);

// clip_grad_norm_ with the norm sqrt(sum_squares[0]): when it is finite and > max_norm (finite, > 0),
// every gradient is multiplied in place by max_norm / (norm + 1e-6). sum_squares is grad_sum_squares'
// result, on the gradients' device. On a GPU (contiguous gradients) the decision and the scaling are one
// kernel and nothing is read back; otherwise the host reads the sum and applies the same rule.
void clip_grads_by_sum_squares_(const NamedTensors& params, const Tensor& sum_squares, double max_norm);
void clip_grads_by_sum_squares_(const std::vector<Tensor>& params, const Tensor& sum_squares, double max_norm);

}  // namespace cpf::optim
