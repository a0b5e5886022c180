#include "framework/autograd/functions/linear_cat.h"

#include "framework/autograd/fp8_autocast.h"
#include "framework/autograd/functions/fp8_linear.h"

#include "framework/autograd/forward_stash.h"
#include "framework/autograd/functions/join.h"
#include "framework/autograd/node.h"
#include "framework/core/error.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/join.h"
#include "framework/tensor/ops/linear.h"
#include "framework/tensor/ops/linear_common.h"
#include "framework/tensor/ops/matmul.h"
#include "framework/tensor/ops/views.h"

namespace cpf {
namespace {

using autograd::GradList;
using autograd::SavedTensor;

constexpr const char* kOp = "linear_cat";

// Every rule on the parts, in the order the messages are tested.
void check_parts(const Tensor& x, const std::vector<LinearWeights>& parts) {
  CPF_CHECK(x.defined() && x.dim() >= 1, kOp, ": x must be a defined tensor of at least one dim");
  CPF_CHECK(!parts.empty(), kOp, ": needs at least one LinearWeights");
  const Tensor& w0 = parts[0].weight;
  for (size_t i = 0; i < parts.size(); ++i) {
    const LinearWeights& p = parts[i];
    CPF_CHECK(p.weight.defined() && p.weight.dim() == 2 && p.weight.size(1) == x.size(-1), kOp, ": part ", i,
              "'s weight must be (N, K) with K = x's last dim ", x.size(-1), ", got ",
              p.weight.defined() ? p.weight.shape() : Shape{});
    CPF_CHECK(p.weight.dtype() == w0.dtype() && p.weight.device() == w0.device(), kOp, ": part ", i, "'s weight is ",
              p.weight.dtype(), " on ", p.weight.device(), " but part 0's is ", w0.dtype(), " on ", w0.device());
    CPF_CHECK(p.weight.dtype() == x.dtype() || (p.weight.dtype() == DType::f32 && x.dtype() == DType::bf16), kOp,
              ": input dtype ", x.dtype(), " does not match the weight dtype ", p.weight.dtype(),
              " (mixed precision narrows f32 parameters to bf16 inputs only)");
    CPF_CHECK(p.bias.defined() == parts[0].bias.defined(), kOp, ": part ", i, (p.bias.defined() ? " has" : " has no"),
              " bias but part 0 ", (parts[0].bias.defined() ? "has one" : "has none"),
              " (the fused bias covers every part or none)");
    CPF_CHECK(!p.bias.defined() ||
                  (p.bias.dim() == 1 && p.bias.size(0) == p.weight.size(0) && p.bias.dtype() == p.weight.dtype()),
              kOp, ": part ", i, "'s bias must be (N) = (", p.weight.size(0), ") of the weight dtype ",
              p.weight.dtype(), ", got ", p.bias.shape(), " ", p.bias.dtype());
    CPF_CHECK(!p.compute_weight.defined() ||
                  (p.compute_weight.dtype() == x.dtype() && p.compute_weight.shape() == p.weight.shape()),
              kOp, ": part ", i, "'s compute_weight must be the weight ", p.weight.shape(), " in x's dtype ", x.dtype(),
              ", got ", p.compute_weight.shape(), " ", p.compute_weight.dtype());
  }
}

// The parts' tensors (compute copy when given, else the master) stacked along dim 0 in x's dtype.
Tensor stack_parts(const std::vector<LinearWeights>& parts, DType dtype, bool bias) {
  std::vector<Tensor> pieces;
  for (const LinearWeights& p : parts) {
    const Tensor& compute = bias ? p.compute_bias : p.compute_weight;
    pieces.push_back(compute.defined() ? compute : (bias ? p.bias : p.weight));
  }
  const Tensor all = pieces.size() == 1 ? pieces[0] : raw::cat(pieces, 0);  // (sum N, K) or (sum N)
  return raw::to(all, dtype);
}

// `stacked`, when given, is the parts' concatenation in x's dtype.
void check_stacked(const Tensor& x, const std::vector<LinearWeights>& parts, int64_t total,
                   const LinearCatStacked& stacked) {
  if (!stacked.weight.defined()) return;
  const int64_t k = parts[0].weight.size(1);
  CPF_CHECK(stacked.weight.dtype() == x.dtype() && stacked.weight.shape() == Shape({total, k}), kOp,
            ": the stacked weight must be (", total, ", ", k, ") ", x.dtype(), ", got ", stacked.weight.shape(), " ",
            stacked.weight.dtype());
  CPF_CHECK(
      stacked.bias.defined() == parts[0].bias.defined() &&
          (!stacked.bias.defined() || (stacked.bias.dtype() == x.dtype() && stacked.bias.shape() == Shape({total}))),
      kOp, ": the stacked bias must be ", parts[0].bias.defined() ? "a (" + std::to_string(total) + ") " : "",
      parts[0].bias.defined() ? dtype_name(x.dtype()) + " tensor" : "undefined (the parts have no bias)", ", got ",
      stacked.bias.defined() ? stacked.bias.shape() : Shape{});
}

}  // namespace

Tensor linear_cat(const Tensor& x, const std::vector<LinearWeights>& parts, int64_t min_fused_rows,
                  const LinearCatStacked& stacked) {
  check_parts(x, parts);
  CPF_CHECK(min_fused_rows >= 0, kOp, ": min_fused_rows must be >= 0, got ", min_fused_rows);
  int64_t total = 0;
  for (const LinearWeights& p : parts) total += p.weight.size(0);
  check_stacked(x, parts, total, stacked);
  if (use_fp8_linear(x, total)) {
    // One FP8 GEMM over the master weights' concatenation (fp8_autocast.h): the parts go in as they are, so
    // the step's kept FP8 copy (fp8_weight_cache.h) serves without concatenating them again.
    std::vector<Tensor> weights, biases;
    for (const LinearWeights& p : parts) {
      weights.push_back(p.weight);
      biases.push_back(p.bias);
    }
    const Tensor bias = parts[0].bias.defined() ? cat(biases, 0) : Tensor();
    return fp8_linear(x, weights, bias, *next_fp8_linear_options());  // (..., sum N)
  }
  if (!stacked.weight.defined() && (x.size(-1) == 0 || x.numel() / x.size(-1) < min_fused_rows)) {
    std::vector<Tensor> pieces;
    for (const LinearWeights& p : parts) pieces.push_back(linear(x, p));  // (..., N_i)
    return pieces.size() == 1 ? pieces[0] : cat(pieces, -1);              // (..., sum N)
  }
  const bool has_bias = parts[0].bias.defined();
  const Tensor w = stacked.weight.defined() ? stacked.weight : stack_parts(parts, x.dtype(), false);  // (sum N, K)
  const Tensor b = !has_bias ? Tensor() : stacked.bias.defined() ? stacked.bias : stack_parts(parts, x.dtype(), true);
  // (..., sum N); a selectively recomputed region keeps it (forward_stash.h)
  const Tensor y = autograd::stashed(kOp, [&] { return std::vector<Tensor>{raw::linear(x, w, b)}; }).front();
  std::vector<Tensor> inputs{x};
  std::vector<int64_t> rows;
  for (const LinearWeights& p : parts) {
    inputs.push_back(p.weight);
    inputs.push_back(p.bias);
    rows.push_back(p.weight.size(0));
  }
  return autograd::record(
      kOp, y, inputs,
      [sx = SavedTensor(x), sw = SavedTensor(w), master = parts[0].weight.dtype(), rows, has_bias](const GradList& g) {
        const Tensor& xv = sx.unpack();
        GradList grads{raw::reshape(raw::matmul(raw::flatten_rows(g[0]), sw.unpack()), xv.shape())};  // (..., K)
        const raw::LinearParamGrads pg = raw::linear_param_grads(g[0], xv, master, has_bias);  // (sum N, K), (sum N)
        int64_t first = 0;
        for (int64_t n : rows) {
          grads.push_back(raw::narrow(pg.weight, 0, first, n));                      // (N_i, K), contiguous
          grads.push_back(has_bias ? raw::narrow(pg.bias, 0, first, n) : Tensor());  // (N_i)
          first += n;
        }
        return grads;
      });
}

}  // namespace cpf
