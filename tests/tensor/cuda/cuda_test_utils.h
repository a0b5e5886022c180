#pragma once
// Helpers for the GPU suites: a fixture that skips without a GPU, host<->device shorthands and a
// norm-wise relative error.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "framework/tensor/cuda/cuda.h"
#include "framework/tensor/ops/copy.h"
#include "support/test_utils.h"

namespace cpf::testing {

// Every GPU test derives from this: without a visible GPU (CI, development machines) it skips with
// the reason, so the suite passes there and runs for real on the GPU machines.
class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::is_available()) {
      GTEST_SKIP() << "no CUDA device is visible (cuda::device_count() == 0): the GPU suites run on the GPU "
                      "machines (scripts/gpu/run_suite.sh)";
    }
  }
};

inline Tensor on_gpu(const Tensor& t) { return raw::to(t, Device::cuda(0)); }
inline Tensor on_cpu(const Tensor& t) { return raw::to(t, Device::cpu()); }

// A random tensor of `dtype` on the CPU, uniform in [low, high) (drawn in f64 and rounded once).
inline Tensor random_cpu(const Shape& shape, DType dtype, uint64_t seed, double low = -1.0, double high = 1.0) {
  return raw::to(random_tensor(shape, DType::f64, seed, low, high), dtype);
}

// ||actual - expected|| / ||expected|| over all elements (in f64); NaN anywhere gives NaN.
inline double rel_error(const Tensor& actual, const Tensor& expected) {
  const auto a = actual.to_vector<double>();
  const auto b = expected.to_vector<double>();
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

// Element-wise tolerances of a device result against the CPU reference.
//   f32: both sides round each operation to f32; CUDA's and libm's exp/log/tanh differ by a few ulps.
//   bf16: both compute in f32 and round once to bf16; when the f32 results straddle a rounding
//         boundary they land one bf16 step apart, 2^-7 relative at most.
//   f64: a few ulps.
inline double rtol_for(DType dtype) {
  switch (dtype) {
    case DType::bf16: return 1.0 / 128;
    case DType::f32: return 1e-5;
    case DType::f64: return 1e-12;
    default: return 0.0;
  }
}
inline double atol_for(DType dtype) {
  switch (dtype) {
    case DType::bf16: return 1e-6;
    case DType::f32: return 1e-6;
    case DType::f64: return 1e-14;
    default: return 0.0;
  }
}

}  // namespace cpf::testing
