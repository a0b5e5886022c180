#include "framework/nn/precision.h"

#include "framework/autograd/node.h"
#include "framework/autograd/ops.h"
#include "framework/nn/compute_copies.h"
#include "framework/tensor/ops/copy.h"

namespace cpf::nn {

Tensor Precision::to_compute(const Tensor& x) const {
  return x.defined() && x.dtype() != compute ? cpf::to(x, compute) : x;
}

Tensor Precision::to_param(const Tensor& x) const { return x.defined() && x.dtype() != param ? cpf::to(x, param) : x; }

std::string precision_name(DType compute) {
  switch (compute) {
    case DType::f32: return "fp32";
    case DType::bf16: return "bf16";
    case DType::f64: return "fp64";
    default: return dtype_name(compute);
  }
}

void check_precision(const Precision& p, const char* op) {
  CPF_CHECK(is_floating(p.param) && p.param != DType::bf16 && is_floating(p.compute), op,
            ": parameters must be f32 or f64 and compute floating: param=", p.param, " compute=", p.compute);
  CPF_CHECK(p.compute == p.param || (p.param == DType::f32 && p.compute == DType::bf16), op, ": compute dtype ",
            p.compute, " with ", p.param,
            " parameters is not supported; use the parameters' dtype, or bf16 compute with f32 parameters");
}

Tensor compute_parameter(const Tensor& param, DType input, const char* op, const char* what) {
  if (!param.defined() || param.dtype() == input) return param;
  CPF_CHECK(param.dtype() == DType::f32 && input == DType::bf16, op, ": input dtype ", input, " does not match the ",
            what, " dtype ", param.dtype(),
            " (mixed precision narrows f32 parameters to bf16 inputs only; convert the input to ", param.dtype(), ")");
  // The step's cached copy when a ComputeCopiesScope holds one (compute_copies.h), else a cast here. Either
  // way a differentiable bf16 tensor whose gradient reaches the f32 parameter converted back.
  const Tensor copy = active_compute_copy(param, input);
  if (!copy.defined()) return cpf::to(param, input);  // (same shape) bf16
  return autograd::record("to", copy.detach(), {param}, [dtype = param.dtype()](const autograd::GradList& g) {
    return autograd::GradList{raw::to(g[0], dtype)};
  });
}

}  // namespace cpf::nn
