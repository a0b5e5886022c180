#pragma once
// Mixed precision: parameters kept in a master dtype (f32), arithmetic in a compute dtype (bf16).
//
//   nn::Precision p{.param = DType::f32, .compute = DType::bf16};
//   Tensor h = p.to_compute(norm(x));   // (T, C) f32 -> bf16, entering a GEMM-heavy sub-block
//   Tensor y = linear.forward(h);       // Linear uses a bf16 copy of its f32 weight
//   x = add(x, p.to_param(y));          // back to f32 for the residual stream
//
// The rule inside the modules is "compute in the input's dtype": Linear, RMSNorm and LayerNorm use
// their parameters in their input's dtype through a differentiable cast (compute_parameter), so the
// backward hands the master parameter an f32 gradient. Only the narrowing f32 -> bf16 is implicit;
// any other mismatch (an f64 input to f32 weights) is an error naming both dtypes. Modules that are
// built from these (MLP, the attention modules) follow without knowing about precision.
//
// The bf16 copies are made once per step when the model keeps them (nn::ComputeCopies,
// compute_copies.h: one multi-tensor cast of the parameters the optimizer changed, invalidated by
// their storage version); without one active, the cast happens per use (docs/training.md).
#include <string>

#include "framework/tensor/tensor.h"

namespace cpf::nn {

struct Precision {
  DType param = DType::f32;    // parameters, gradients, optimizer state, the residual stream
  DType compute = DType::f32;  // GEMMs and activations of the sub-blocks

  bool mixed() const { return param != compute; }
  // x converted to the compute / parameter dtype (differentiable; x itself when already there).
  Tensor to_compute(const Tensor& x) const;
  Tensor to_param(const Tensor& x) const;
};

// The name run.precision uses for a compute dtype: "fp32" (f32), "bf16", "fp64" (f64, gradchecks).
std::string precision_name(DType compute);

// Throws unless `p` is a supported pair: compute == param (f32, f64 or bf16), or f32 master weights
// with bf16 compute. `op` prefixes the message.
void check_precision(const Precision& p, const char* op);

// `param` as a module whose input has dtype `input` uses it: itself when the dtypes agree, a
// differentiable bf16 copy of an f32 parameter for a bf16 input (the active ComputeCopies' one when it
// holds an up-to-date copy, else cast now; its gradient arrives in f32), and an error naming `op`,
// `what` and both dtypes otherwise. An undefined `param` stays undefined.
Tensor compute_parameter(const Tensor& param, DType input, const char* op, const char* what);

}  // namespace cpf::nn
