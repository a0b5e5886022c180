#include "framework/autograd/functions/add_norm.h"

#include <optional>

#include "framework/autograd/node.h"
#include "framework/tensor/ops/add_norm.h"

namespace cpf {
namespace {

using autograd::GradList;
using autograd::SavedTensor;

AddNormOutput fused(raw::NormKind kind, const Tensor& x, const Tensor& branch, const Tensor& weight, const Tensor& bias,
                    double eps, DType out_dtype) {
  raw::AddNormResult r = raw::add_norm(kind, x, branch, weight, bias, eps, out_dtype);
  const bool has_branch = branch.defined();
  const std::optional<DType> branch_dtype = has_branch ? std::optional<DType>(branch.dtype()) : std::nullopt;
  const char* name = kind == raw::NormKind::layer_norm ? "add_layer_norm" : "add_rms_norm";
  auto backward = [kind, sx1 = SavedTensor(r.x1), sw = SavedTensor(weight), sm = SavedTensor(r.mean),
                   sr = SavedTensor(r.rstd), has_bias = bias.defined(), branch_dtype, has_branch,
                   out_dtype](const GradList& g) {
    // g = {grad_x1, grad_y} with a branch, {grad_y} without (x1 is then x, not an output).
    const Tensor grad_x1 = has_branch ? g[0] : Tensor();
    const Tensor grad_y = has_branch ? g[1] : g[0];
    raw::AddNormGrads d = raw::add_norm_backward(kind, grad_x1, grad_y, out_dtype, sx1.unpack(), sw.unpack(), has_bias,
                                                 sm.unpack(), sr.unpack(), branch_dtype);
    return GradList{d.dx, d.dbranch, d.dweight, d.dbias};
  };
  if (!has_branch) return {x, autograd::record(name, r.y, {x, branch, weight, bias}, std::move(backward))};
  std::vector<Tensor> out = autograd::record(name, {r.x1, r.y}, {x, branch, weight, bias}, std::move(backward));
  return {out[0], out[1]};
}

}  // namespace

AddNormOutput add_layer_norm(const Tensor& x, const Tensor& branch, const Tensor& weight, const Tensor& bias,
                             double eps, DType out_dtype) {
  return fused(raw::NormKind::layer_norm, x, branch, weight, bias, eps, out_dtype);
}

AddNormOutput add_rms_norm(const Tensor& x, const Tensor& branch, const Tensor& weight, double eps, DType out_dtype) {
  return fused(raw::NormKind::rms_norm, x, branch, weight, Tensor(), eps, out_dtype);
}

}  // namespace cpf
