#include "framework/nn/precision.h"

#include "framework/autograd/ops.h"

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
  CPF_CHECK(p.compute == p.param || (p.param == DType::f32 && p.compute == DType::bf16), op,
            ": compute dtype ", p.compute, " with ", p.param,
            " parameters is not supported; use the parameters' dtype, or bf16 compute with f32 parameters");
}

Tensor compute_parameter(const Tensor& param, DType input, const char* op, const char* what) {
  if (!param.defined() || param.dtype() == input) return param;
  CPF_CHECK(param.dtype() == DType::f32 && input == DType::bf16, op, ": input dtype ", input, " does not match the ",
            what, " dtype ", param.dtype(),
            " (mixed precision narrows f32 parameters to bf16 inputs only; convert the input to ", param.dtype(), ")");
  return cpf::to(param, input);  // (same shape) bf16; the backward converts the gradient to f32
}

}  // namespace cpf::nn
