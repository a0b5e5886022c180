#include "framework/autograd/gradcheck.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <sstream>

#include "framework/autograd/engine.h"
#include "framework/autograd/grad_mode.h"
#include "framework/autograd/gradcheck_tally.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/random.h"

namespace cpf {
namespace {

using gradcheck_detail::contract;
using gradcheck_detail::GradcheckTally;

std::vector<int64_t> chosen_elements(int64_t numel, int64_t limit, std::mt19937_64& rng) {
  std::vector<int64_t> all(static_cast<size_t>(numel));
  std::iota(all.begin(), all.end(), 0);
  if (limit <= 0 || numel <= limit) return all;
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(static_cast<size_t>(limit));
  std::sort(all.begin(), all.end());
  return all;
}

// Refuses what finite differences cannot check: a non-positive eps, no input requiring grad, non-f64
// inputs and inputs whose elements overlap (perturbing one would move several).
void check_inputs(const std::vector<Tensor>& inputs, const GradcheckOptions& options) {
  CPF_CHECK(options.eps > 0, "gradcheck: eps must be positive, got ", options.eps);
  bool any = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined() || !inputs[i].requires_grad()) continue;
    any = true;
    CPF_CHECK(inputs[i].dtype() == DType::f64, "gradcheck: input ", i, " of shape ", inputs[i].shape(), " is ",
              inputs[i].dtype(), "; finite differences need f64 inputs");
    for (int64_t d = 0; d < inputs[i].dim(); ++d) {
      CPF_CHECK(inputs[i].size(d) <= 1 || inputs[i].stride(d) != 0, "gradcheck: input ", i, " of shape ",
                inputs[i].shape(), " has overlapping elements (stride 0 at dim ", d, "); pass a contiguous copy");
    }
  }
  CPF_CHECK(any, "gradcheck: no input requires grad; call set_requires_grad() on the inputs to check");
}

// Runs fn once and backpropagates L = sum_k <weights[k], outputs[k]> into the inputs' grads; returns
// the random weights (f64, one per floating output, on its device) the finite differences contract with.
std::vector<Tensor> analytic_gradients(const GradcheckFn& fn, const std::vector<Tensor>& inputs, uint64_t seed) {
  for (const Tensor& t : inputs) {
    if (t.defined() && t.requires_grad()) t.set_grad(Tensor());
  }
  std::vector<Tensor> outputs = fn(inputs);
  Generator weight_gen(seed);
  std::vector<Tensor> weights(outputs.size());
  std::vector<Tensor> roots, seeds;
  for (size_t k = 0; k < outputs.size(); ++k) {
    if (!outputs[k].defined() || !is_floating(outputs[k].dtype())) continue;
    // Drawn on the host so every device contracts with the same weights, then moved to the output.
    weights[k] = raw::to(randn(outputs[k].shape(), {.dtype = DType::f64}, &weight_gen), outputs[k].device());
    if (outputs[k].requires_grad()) {
      roots.push_back(outputs[k]);
      seeds.push_back(raw::to(weights[k], outputs[k].dtype()));
    }
  }
  if (!roots.empty()) backward(roots, seeds);
  return weights;
}

}  // namespace

std::string GradcheckReport::str() const {
  std::ostringstream os;
  os << (ok ? "gradcheck passed" : "gradcheck FAILED") << ": " << checked
     << " elements, max |analytic - numeric| = " << max_abs_error;
  if (worst_index >= 0) {
    os << "; worst: input " << worst_input << " " << shape_str(worst_shape) << " element " << worst_index
       << " analytic=" << worst_analytic << " numeric=" << worst_numeric;
  }
  return os.str();
}

GradcheckReport gradcheck(const GradcheckFn& fn, const std::vector<Tensor>& inputs, GradcheckOptions options) {
  check_inputs(inputs, options);
  const std::vector<Tensor> weights = analytic_gradients(fn, inputs, options.seed);

  GradcheckTally tally(options);
  std::mt19937_64 rng(options.seed);
  NoGradGuard no_grad;

  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined() || !inputs[i].requires_grad()) continue;
    const Tensor grad = inputs[i].grad().defined() ? inputs[i].grad() : zeros_like(inputs[i].detach());
    const Tensor analytic = raw::contiguous(raw::to(grad, Device::cpu()));
    const double* ga = analytic.data<double>();
    // Perturb the caller's tensor in place (through its strides), so functions that reach the
    // inputs through other handles, e.g. a module's parameters, see the change too. A device input
    // is perturbed where it lives, through its backend's byte copies (no kernel, no version bump),
    // so the finite differences run the device's forward kernels.
    double* base = inputs[i].data<double>();
    const Device device = inputs[i].device();
    auto read = [device](const double* at) {
      double value;
      if (device.is_cpu()) return *at;
      device_backend(device.type).copy(&value, Device::cpu(), at, device, sizeof(double));
      return value;
    };
    auto write = [device](double* at, double value) {
      if (device.is_cpu()) {
        *at = value;
      } else {
        device_backend(device.type).copy(at, device, &value, Device::cpu(), sizeof(double));
      }
    };
    const Shape& shape = inputs[i].shape();
    const Shape& strides = inputs[i].strides();
    for (int64_t e : chosen_elements(inputs[i].numel(), options.max_elements_per_input, rng)) {
      int64_t offset = 0;
      for (int64_t d = static_cast<int64_t>(shape.size()) - 1, rest = e; d >= 0; --d) {
        offset += (rest % shape[d]) * strides[d];
        rest /= shape[d];
      }
      double* x = base + offset;
      const double original = read(x);
      write(x, original + options.eps);
      const double plus = contract(fn(inputs), weights);
      write(x, original - options.eps);
      const double minus = contract(fn(inputs), weights);
      write(x, original);
      tally.add(i, e, inputs[i].shape(), ga[e], (plus - minus) / (2 * options.eps));
    }
  }
  return tally.report();
}

GradcheckReport gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                          const std::vector<Tensor>& inputs, GradcheckOptions options) {
  return gradcheck(GradcheckFn([&fn](const std::vector<Tensor>& in) { return std::vector<Tensor>{fn(in)}; }), inputs,
                   options);
}

}  // namespace cpf
