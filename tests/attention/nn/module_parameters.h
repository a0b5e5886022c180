#pragma once
// Shared by the attention module tests: a module's parameter by name, a hand-composed projection
// through it, and gradcheck's input list of x followed by the module's parameters.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "framework/autograd/ops.h"
#include "framework/nn/module.h"

namespace cpf::testing {

inline Tensor param(const nn::Module& m, const std::string& name) {
  for (const auto& [n, t] : m.named_parameters()) {
    if (n == name) return t;
  }
  ADD_FAILURE() << "no parameter " << name;
  return Tensor();
}

// x W^T with the module's `name`.weight (no bias).
inline Tensor linear(const nn::Module& m, const std::string& name, const Tensor& x) {
  return matmul(x, transpose(param(m, name + ".weight"), 0, 1));
}

// x first, then the module's parameters (perturbed in place by gradcheck, so the module sees them).
inline std::vector<Tensor> with_parameters(const Tensor& x, const nn::Module& m) {
  std::vector<Tensor> inputs{x};
  for (const Tensor& p : m.parameters()) inputs.push_back(p);
  return inputs;
}

}  // namespace cpf::testing
