#pragma once
// Helpers shared by every test: error-message matchers, tensor comparison, gradcheck assertions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "framework/core/error.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/random.h"
#include "framework/tensor/tensor.h"

// Expects `statement` to throw cpf::Error whose message contains `substring`.
#define EXPECT_CPF_ERROR(statement, substring)                                                              \
  do {                                                                                                      \
    bool cpf_thrown_ = false;                                                                               \
    try {                                                                                                   \
      statement;                                                                                            \
    } catch (const ::cpf::Error& e) {                                                                       \
      cpf_thrown_ = true;                                                                                   \
      EXPECT_NE(std::string(e.what()).find(substring), std::string::npos)                                   \
          << "message was: " << e.what() << "\nexpected to contain: " << (substring);                       \
    }                                                                                                       \
    EXPECT_TRUE(cpf_thrown_) << "expected cpf::Error containing '" << (substring) << "' from: " #statement; \
  } while (0)

namespace cpf::testing {

// Whether a and b hold the same bytes (same dtype and shape, compared contiguous, on any device): FP8 codes,
// where equal values must be equal bit for bit.
inline bool same_bytes(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const Tensor ac = raw::contiguous(raw::to(a, Device::cpu())), bc = raw::contiguous(raw::to(b, Device::cpu()));
  const auto* pa = static_cast<const uint8_t*>(ac.raw_data());
  const auto* pb = static_cast<const uint8_t*>(bc.raw_data());
  return std::equal(pa, pa + ac.numel() * dtype_size(a.dtype()), pb);
}

// Max |a - b| <= atol + rtol * |b| elementwise (b is the reference), NaN equal only to NaN.
inline ::testing::AssertionResult all_close(const Tensor& actual, const Tensor& expected, double atol = 1e-6,
                                            double rtol = 1e-5) {
  if (actual.shape() != expected.shape()) {
    return ::testing::AssertionFailure() << "shapes differ: " << shape_str(actual.shape()) << " vs "
                                         << shape_str(expected.shape());
  }
  const auto a = actual.to_vector<double>();
  const auto b = expected.to_vector<double>();
  double worst = 0;
  int64_t worst_i = -1;
  for (size_t i = 0; i < a.size(); ++i) {
    const bool both_nan = std::isnan(a[i]) && std::isnan(b[i]);
    const bool same_inf = std::isinf(a[i]) && a[i] == b[i];
    if (both_nan || same_inf) continue;
    const double err = std::abs(a[i] - b[i]);
    const double excess = std::isnan(err) ? INFINITY : err - (atol + rtol * std::abs(b[i]));
    if (excess > worst || (std::isinf(excess) && worst_i < 0)) {
      worst = excess;
      worst_i = static_cast<int64_t>(i);
    }
  }
  if (worst_i >= 0) {
    return ::testing::AssertionFailure() << "element " << worst_i << " of " << shape_str(actual.shape()) << ": actual "
                                         << a[worst_i] << " vs expected " << b[worst_i] << " (atol " << atol
                                         << ", rtol " << rtol << ")";
  }
  return ::testing::AssertionSuccess();
}

// A random f64/f32 tensor from a fixed seed, uniform in [-1, 1) unless given.
inline Tensor random_tensor(const Shape& shape, DType dtype = DType::f64, uint64_t seed = 1, double low = -1.0,
                            double high = 1.0) {
  Generator gen(seed);
  return uniform(shape, low, high, {.dtype = dtype}, &gen);
}

// A leaf requiring grad, for gradchecks.
inline Tensor grad_input(const Shape& shape, uint64_t seed = 1, double low = -1.0, double high = 1.0) {
  Tensor t = random_tensor(shape, DType::f64, seed, low, high);
  t.set_requires_grad(true);
  return t;
}

}  // namespace cpf::testing
