#pragma once
// Finite-difference gradient check. The function's outputs are contracted with fixed random weights
// into a scalar L = sum_k <w_k, out_k>; the analytic dL/dx from backward is compared element by
// element with the central difference (L(x + eps e_i) - L(x - eps e_i)) / (2 eps). Inputs should be
// f64. Inputs that do not require grad are held constant. Inputs are perturbed in place (and restored),
// so a function that reaches them through other handles (a module's parameters) is checked too.
// Inputs may live on a device (cuda:N): they are perturbed there through the backend's byte copies, so
// the finite differences run the device's kernels; the report's values are read back to the host.
#include <functional>
#include <string>
#include <vector>

#include "framework/tensor/tensor.h"

namespace cpf {

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-6;
  double rtol = 1e-4;
  // Check at most this many elements per input (a random subset); <= 0 checks all of them.
  int64_t max_elements_per_input = 0;
  uint64_t seed = 1234;
};

struct GradcheckReport {
  bool ok = true;
  int64_t checked = 0;       // elements compared
  double max_abs_error = 0;  // over all checked elements
  // The element with the largest error relative to its tolerance.
  size_t worst_input = 0;
  int64_t worst_index = -1;  // flat row-major index into that input
  Shape worst_shape;
  double worst_analytic = 0;
  double worst_numeric = 0;
  std::string str() const;
};

using GradcheckFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& inputs)>;

GradcheckReport gradcheck(const GradcheckFn& fn, const std::vector<Tensor>& inputs, GradcheckOptions options = {});
// Convenience for single-output functions.
GradcheckReport gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                          const std::vector<Tensor>& inputs, GradcheckOptions options = {});

}  // namespace cpf
