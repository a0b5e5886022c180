#pragma once
// The transformer feed-forward block:
//
//   gelu:    x -> fc_in (C -> I) -> gelu -> fc_out (I -> C)                     (GPT-2)
//   swiglu:  x -> silu(gate_proj(x)) * up_proj(x) (C -> I) -> down_proj (I -> C) (Llama)
//
// x (..., C) -> (..., C). Parameter names follow the usual checkpoints (fc_in/fc_out as GPT-J,
// gate_proj/up_proj/down_proj as Llama). The output projection can get its own init std: GPT-2
// scales residual projections by 1/sqrt(2 * layers).
#include <memory>
#include <string>

#include "framework/core/generator.h"
#include "framework/nn/linear.h"
#include "framework/nn/module.h"

namespace cpf::nn {

enum class Activation { gelu, swiglu };
const char* activation_name(Activation activation);  // "gelu" | "swiglu"

struct MLPOptions {
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  Activation activation = Activation::gelu;
  bool bias = false;
  double init_std = 0.0;      // input projections; 0 = Linear's uniform default
  double out_init_std = 0.0;  // output projection; 0 = init_std
  DType dtype = DType::f32;
};

class MLP : public Module {
 public:
  explicit MLP(const MLPOptions& options, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) const;
  const MLPOptions& options() const { return options_; }

 private:
  MLPOptions options_;
  std::shared_ptr<Linear> in_, gate_, out_;  // gelu: fc_in / fc_out; swiglu: up_proj, gate_proj, down_proj
};

}  // namespace cpf::nn
