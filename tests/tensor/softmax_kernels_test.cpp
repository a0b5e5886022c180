#include "framework/tensor/cpu/softmax_kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace cpf {
namespace {

constexpr float kInfF = std::numeric_limits<float>::infinity();

// Distance in units in the last place of the float nearest to `exact`.
double ulps(float value, double exact) {
  const float nearest = static_cast<float>(exact);
  const double ulp = static_cast<double>(std::nextafter(nearest, kInfF)) - nearest;
  return std::abs(static_cast<double>(value) - exact) / ulp;
}

TEST(SoftmaxKernels, F32ExpIsAccurateOverTheNormalRange) {
  const int64_t n = 200001;
  std::vector<float> x(n), y(n);
  for (int64_t i = 0; i < n; ++i) x[i] = -87.3f + 175.2f * static_cast<float>(i) / static_cast<float>(n - 1);
  cpu::exp_sum(x.data(), 0.0f, y.data(), n);
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) worst = std::max(worst, ulps(y[i], std::exp(static_cast<double>(x[i]))));
  EXPECT_LE(worst, 2.0);
}

TEST(SoftmaxKernels, F32SpecialValues) {
  // Every lane position (the 8/4-lane body and the ragged tail) sees each special value.
  for (int64_t n : {1, 3, 4, 5, 8, 9, 13, 16, 17}) {
    for (int64_t k = 0; k < n; ++k) {
      std::vector<float> x(n, -1.0f), y(n);
      for (float special : {-kInfF, kInfF, std::numeric_limits<float>::quiet_NaN(), -100.0f, 100.0f}) {
        x[k] = special;
        const float sum = cpu::exp_sum(x.data(), 0.0f, y.data(), n);
        if (special == -kInfF || special == -100.0f) {
          EXPECT_EQ(y[k], 0.0f) << special;  // masked and subnormal results are exactly 0
          EXPECT_NEAR(sum, (n - 1) * std::exp(-1.0), 1e-5 * n);
        } else if (std::isnan(special)) {
          EXPECT_TRUE(std::isnan(y[k]));
          EXPECT_TRUE(std::isnan(sum));
        } else {
          EXPECT_EQ(y[k], kInfF) << special;
          EXPECT_EQ(sum, kInfF);
        }
        for (int64_t j = 0; j < n; ++j) {
          if (j != k) EXPECT_NEAR(y[j], std::exp(-1.0), 1e-7) << n << " " << k << " " << j;
        }
      }
    }
  }
}

TEST(SoftmaxKernels, SumsShiftsAndInPlace) {
  for (int64_t n : {1, 7, 8, 31, 100}) {
    std::vector<float> x(n), shifts(n), out(n);
    std::vector<double> xd(n), sd(n), outd(n);
    double expected = 0;
    for (int64_t i = 0; i < n; ++i) {
      x[i] = static_cast<float>(i % 11) * 0.37f - 2.0f;
      shifts[i] = static_cast<float>(i % 5) * 0.5f;
      xd[i] = x[i];
      sd[i] = shifts[i];
      expected += std::exp(static_cast<double>(x[i]) - 1.5);
    }
    EXPECT_NEAR(cpu::exp_sum(x.data(), 1.5f, nullptr, n), expected, 1e-6 * expected);
    EXPECT_NEAR(cpu::exp_sum(xd.data(), 1.5, nullptr, n), expected, 1e-12 * expected);
    cpu::exp_sub(x.data(), shifts.data(), out.data(), n);
    cpu::exp_sub(xd.data(), sd.data(), outd.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const double e = std::exp(static_cast<double>(x[i]) - shifts[i]);
      EXPECT_NEAR(out[i], e, 2e-7 * e);
      EXPECT_NEAR(outd[i], e, 1e-15 * e);
    }
    std::vector<float> inplace = x;
    cpu::exp_sum(inplace.data(), 0.5f, inplace.data(), n);
    for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(inplace[i], std::exp(static_cast<double>(x[i]) - 0.5), 1e-6);
  }
}

}  // namespace
}  // namespace cpf
