#pragma once
// One differentiable-op test case that runs on any device: its inputs as recipes (shape, range, strided
// or not, fixed index/mask tensors), the function under test, and the helpers that build the inputs on
// a device at a dtype, run forward + backward and compare two devices' results. The registry of cases
// (tests/autograd/op_cases.h) drives the device-parameterised gradcheck and the device-vs-CPU parity
// suites (tests/autograd/device_parity_test.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "framework/autograd/engine.h"
#include "framework/autograd/gradcheck.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/views.h"
#include "framework/tensor/random.h"
#include "support/test_device.h"

namespace cpf::testing {

// One input of a case.
struct CaseInput {
  enum class Kind { differentiable, constant, fixed };
  Kind kind = Kind::differentiable;
  Shape shape;  // the shape the op sees
  double low = -1.0, high = 1.0;
  bool strided = false;  // seen through a transpose of its last two dims (a non-contiguous view)
  Tensor fixed;          // Kind::fixed: a host tensor (indices, masks) copied to the device as it is
};

// A floating input that requires grad, uniform in [low, high).
inline CaseInput diff(Shape shape, double low = -1.0, double high = 1.0) {
  return {CaseInput::Kind::differentiable, std::move(shape), low, high, false, Tensor()};
}
// The same, stored transposed in its last two dims so the op reads non-unit strides.
inline CaseInput strided(Shape shape, double low = -1.0, double high = 1.0) {
  return {CaseInput::Kind::differentiable, std::move(shape), low, high, true, Tensor()};
}
// A floating input that does not require grad (held constant by gradcheck).
inline CaseInput constant_input(Shape shape, double low = -1.0, double high = 1.0) {
  return {CaseInput::Kind::constant, std::move(shape), low, high, false, Tensor()};
}
// A fixed tensor (indices, masks) built on the host.
inline CaseInput fixed(Tensor host) { return {CaseInput::Kind::fixed, host.shape(), 0, 0, false, std::move(host)}; }

// How close a device's result must be to the CPU's (tolerance_for below gives the default per dtype).
struct Tolerance {
  double rtol = 0, atol = 0, normwise = INFINITY;
};

// A case's own bound: (the run's dtype, the compared result's dtype, its largest CPU magnitude) -> bound.
using ToleranceFn = std::function<Tolerance(DType run, DType result, double scale)>;

struct OpCase {
  std::string name;  // unique, [A-Za-z0-9_]: part of the test names
  std::string op;    // the function of framework/autograd/functions/*.h it exercises
  std::vector<CaseInput> inputs;
  GradcheckFn fn;
  // false: no gradient to check (argmax, in-place updates outside the graph); forward parity only.
  bool differentiable = true;
  // Pure data movement (views, copies, gathers): forward results must be bit-identical across devices.
  bool exact = false;
  GradcheckOptions gradcheck_options = {};
  // Empty: tolerance_for(the result's dtype). Set only where the device legitimately evaluates another
  // approximation of the function, or a result's dtype is wider than the run's (the case says why);
  // every other case keeps the default bounds.
  ToleranceFn tolerance;
};

// The case's inputs on `device` at `dtype` (floating inputs; fixed ones keep theirs). Every device gets
// bit-identical values: drawn in f64 on the host from seed + input position, rounded once.
inline std::vector<Tensor> make_case_inputs(const OpCase& c, Device device, DType dtype, uint64_t seed = 100) {
  std::vector<Tensor> inputs;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const CaseInput& in = c.inputs[i];
    if (in.kind == CaseInput::Kind::fixed) {
      inputs.push_back(raw::to(in.fixed, device));
      continue;
    }
    Shape stored = in.shape;
    if (in.strided) std::swap(stored[stored.size() - 1], stored[stored.size() - 2]);
    Tensor t = random_on(device, stored, dtype, seed + i, in.low, in.high);
    if (in.strided) t = raw::transpose(t, -1, -2);
    if (in.kind == CaseInput::Kind::differentiable) t.set_requires_grad(true);
    inputs.push_back(t);
  }
  return inputs;
}

// Forward outputs and input gradients of one run, on the host.
struct CaseRun {
  std::vector<Tensor> outputs;                       // undefined where the case returned an undefined tensor
  std::vector<Tensor> grads;                         // per input; undefined for inputs without grad
  std::vector<Device> output_devices, grad_devices;  // where they were computed
};

// Runs the case on `device` at `dtype`: forward, then (when differentiable) backward with fixed random
// output weights (the same on every device), and brings everything to the host.
inline CaseRun run_case(const OpCase& c, Device device, DType dtype) {
  std::vector<Tensor> inputs = make_case_inputs(c, device, dtype);
  std::vector<Tensor> outputs = c.fn(inputs);
  CaseRun run;
  std::vector<Tensor> roots, seeds;
  Generator weights(7);
  for (const Tensor& out : outputs) {
    run.outputs.push_back(out.defined() ? raw::to(out, Device::cpu()) : Tensor());
    run.output_devices.push_back(out.defined() ? out.device() : Device::cpu());
    if (!out.defined() || !out.requires_grad()) continue;
    roots.push_back(out);
    seeds.push_back(raw::to(raw::to(randn(out.shape(), {.dtype = DType::f64}, &weights), out.dtype()), device));
  }
  if (c.differentiable && !roots.empty()) backward(roots, seeds);
  for (const Tensor& in : inputs) {
    const bool has_grad = in.requires_grad() && in.grad().defined();
    run.grads.push_back(has_grad ? raw::to(in.grad(), Device::cpu()) : Tensor());
    run.grad_devices.push_back(has_grad ? in.grad().device() : Device::cpu());
  }
  return run;
}

// How close a device's result must be to the CPU's, per dtype.
//   f64: both sides round every operation to f64; transcendental functions and summation orders differ
//        by a few ulps: 1e-10 relative (plus 1e-12 for results that cancel to ~0).
//   f32: the same in f32: 1e-5 relative, 1e-6 absolute (inputs are O(1), sums have few terms).
//   bf16: each kernel computes in f32 and rounds its result to bf16 once, as the CPU does. When the two
//        f32 results (different summation order, hardware exp) straddle a rounding boundary they land one
//        bf16 step apart (2^-8 to 2^-7 relative), and a backward that chains k rounded ops can differ by
//        k steps, relative to the inputs' magnitude when a later sum cancels. Element-wise bound: 2^-5
//        relative plus 2^-5 of the tensor's largest magnitude (4 steps); since only elements at rounding
//        boundaries differ, the norm-wise relative error must also stay within one step (2^-7). A wrong
//        index, factor or formula moves most elements by O(1) and fails both.
//   exact cases (data movement): f32/f64/bf16 forward results bit-identical.
// A case may replace these with its own (OpCase::tolerance, documented at the case).
inline Tolerance tolerance_for(DType dtype, bool exact, double scale) {
  if (exact) return {0, 0, 0};
  switch (dtype) {
    case DType::f64: return {1e-10, 1e-12, INFINITY};
    case DType::f32: return {1e-5, 1e-6, INFINITY};
    case DType::bf16: return {1.0 / 32, scale / 32, 1.0 / 128};
    default: return {0, 0, 0};  // integer and bool results (argmax, masks): equal
  }
}

// ||a - b|| / ||b|| in f64 (||a - b|| when b is all zeros).
inline double normwise_error(const Tensor& actual, const Tensor& expected) {
  const auto a = actual.to_vector<double>();
  const auto b = expected.to_vector<double>();
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

// Compares one tensor of a device run with the CPU's, naming what it is on failure.
inline ::testing::AssertionResult matches_cpu(const Tensor& device_result, const Tensor& cpu_result,
                                              const std::string& what, bool exact, DType run_dtype = DType::f64,
                                              const ToleranceFn& own = {}) {
  if (device_result.defined() != cpu_result.defined()) {
    return ::testing::AssertionFailure() << what << ": defined on " << (cpu_result.defined() ? "the CPU" : "the device")
                                         << " only";
  }
  if (!cpu_result.defined()) return ::testing::AssertionSuccess();
  if (device_result.dtype() != cpu_result.dtype()) {
    return ::testing::AssertionFailure() << what << ": dtype " << device_result.dtype() << " on the device, "
                                         << cpu_result.dtype() << " on the CPU";
  }
  double scale = 0;
  for (double v : cpu_result.to_vector<double>()) scale = std::max(scale, std::isfinite(v) ? std::abs(v) : 0.0);
  const Tolerance tol =
      own ? own(run_dtype, cpu_result.dtype(), scale) : tolerance_for(cpu_result.dtype(), exact, scale);
  ::testing::AssertionResult close = all_close(device_result, cpu_result, tol.atol, tol.rtol);
  if (!close) return ::testing::AssertionFailure() << what << " (" << cpu_result.dtype() << "): " << close.message();
  if (std::isfinite(tol.normwise)) {
    const double err = normwise_error(device_result, cpu_result);
    if (err > tol.normwise) {
      return ::testing::AssertionFailure()
             << what << " (" << cpu_result.dtype() << "): norm-wise relative error " << err << " > " << tol.normwise;
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace cpf::testing
