// FP8 storage (framework/tensor/float8.h) and the FP8 raw ops on the CPU (framework/tensor/ops/fp8.h):
// every code of both formats against its definition, rounding and saturation, the scaled cast, amax and
// the scale rule, and the FP8 GEMM against a naive product of the decoded values; every refusal with
// its message. The CUDA kernels are checked against these in tests/tensor/cuda/fp8_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "framework/tensor/float8.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/fp8.h"
#include "framework/tensor/ops/views.h"
#include "tests/support/test_utils.h"

namespace cpf {
namespace {

using testing::all_close;
using testing::random_tensor;

// The value of an FP8 code from the format's definition (sign, exponent field, mantissa field).
double reference_value(uint8_t bits, int mant_bits, int bias) {
  const int exp_field = (bits >> mant_bits) & ((1 << (7 - mant_bits)) - 1);
  const int mant = bits & ((1 << mant_bits) - 1);
  const double sign = (bits & 0x80) ? -1.0 : 1.0;
  if (exp_field == 0) return sign * mant * std::pow(2.0, 1 - bias - mant_bits);
  return sign * (1.0 + mant * std::pow(2.0, -mant_bits)) * std::pow(2.0, exp_field - bias);
}

Tensor scalar(float v) { return from_vector(std::vector<float>{v}, {}); }
float value_of(const Tensor& t) { return t.to_vector<float>()[0]; }

TEST(Float8, EveryE4M3CodeDecodesToItsDefinitionAndEncodesBack) {
  int finite = 0;
  for (int b = 0; b < 256; ++b) {
    const float v = static_cast<float>(float8_e4m3::from_bits(static_cast<uint8_t>(b)));
    if ((b & 0x7f) == 0x7f) {  // s 1111 111: the only NaNs; no infinities
      EXPECT_TRUE(std::isnan(v)) << b;
      continue;
    }
    EXPECT_EQ(v, reference_value(static_cast<uint8_t>(b), 3, 7)) << b;
    EXPECT_EQ(float8_e4m3(v).bits, b) << "code " << b << " value " << v;
    ++finite;
  }
  EXPECT_EQ(finite, 254);
  EXPECT_EQ(static_cast<float>(float8_e4m3::from_bits(0x7e)), 448.0f);
  EXPECT_EQ(static_cast<float>(float8_e4m3::from_bits(0x01)), std::ldexp(1.0f, -9));  // smallest subnormal
}

TEST(Float8, EveryE5M2CodeDecodesToItsDefinitionAndEncodesBack) {
  for (int b = 0; b < 256; ++b) {
    const float v = static_cast<float>(float8_e5m2::from_bits(static_cast<uint8_t>(b)));
    const int exp_field = (b >> 2) & 0x1f;
    if (exp_field == 0x1f) {
      EXPECT_TRUE((b & 3) == 0 ? std::isinf(v) : std::isnan(v)) << b;
      continue;
    }
    EXPECT_EQ(v, reference_value(static_cast<uint8_t>(b), 2, 15)) << b;
    EXPECT_EQ(float8_e5m2(v).bits, b) << "code " << b << " value " << v;
  }
  EXPECT_EQ(static_cast<float>(float8_e5m2::from_bits(0x7b)), 57344.0f);
}

TEST(Float8, CastsRoundToNearestEvenAndSaturate) {
  // Between 1 (mantissa 000) and 1.125 (001) the tie goes to the even 1; between 1.125 and 1.25 to 1.25.
  EXPECT_EQ(static_cast<float>(float8_e4m3(1.0625f)), 1.0f);
  EXPECT_EQ(static_cast<float>(float8_e4m3(1.1875f)), 1.25f);
  EXPECT_EQ(static_cast<float>(float8_e4m3(1.07f)), 1.125f);
  // Subnormals: the quantum is 2^-9; half of it rounds to the even 0, 1.5 quanta to 2 quanta.
  EXPECT_EQ(static_cast<float>(float8_e4m3(std::ldexp(1.0f, -10))), 0.0f);
  EXPECT_EQ(static_cast<float>(float8_e4m3(std::ldexp(1.5f, -9))), std::ldexp(1.0f, -8));
  // Beyond the largest finite value, infinity included: that value with the sign.
  EXPECT_EQ(static_cast<float>(float8_e4m3(1000.0f)), 448.0f);
  EXPECT_EQ(static_cast<float>(float8_e4m3(-INFINITY)), -448.0f);
  EXPECT_EQ(static_cast<float>(float8_e5m2(INFINITY)), 57344.0f);
  EXPECT_EQ(static_cast<float>(float8_e5m2(-1e30f)), -57344.0f);
  EXPECT_TRUE(std::isnan(static_cast<float>(float8_e4m3(NAN))));
  EXPECT_TRUE(std::isnan(static_cast<float>(float8_e5m2(NAN))));
  EXPECT_EQ(float8_e4m3(-0.0f).bits, 0x80);
  // Every float rounds to the nearer of its two neighbouring codes (checked on a sweep of values).
  for (float x = -500.0f; x <= 500.0f; x += 0.37f) {
    const float q = static_cast<float>(float8_e4m3(x));
    for (int b = 0; b < 256; ++b) {
      const float c = static_cast<float>(float8_e4m3::from_bits(static_cast<uint8_t>(b)));
      if (!std::isnan(c) && std::fabs(x) <= 448.0f) ASSERT_LE(std::fabs(q - x), std::fabs(c - x)) << x;
    }
  }
}

TEST(Fp8Ops, QuantizeScalesRoundsAndRecordsTheAmax) {
  const Tensor x = from_vector(std::vector<float>{0.5f, -3.0f, 100.0f, 0.001f}, {2, 2});
  const Tensor amax_out = scalar(50.0f);
  const Tensor q = raw::quantize_fp8(x, scalar(4.0f), DType::f8e4m3, amax_out);
  EXPECT_EQ(q.dtype(), DType::f8e4m3);
  EXPECT_EQ(q.shape(), (Shape{2, 2}));
  // x * 4 = 2, -12, 400 (-> 384: the nearest code), 0.004 (-> 0.00390625 = 2^-8).
  const Tensor back = raw::dequantize_fp8(q, scalar(0.25f), DType::f32);
  EXPECT_EQ(back.to_vector<float>(), (std::vector<float>{0.5f, -3.0f, 96.0f, 0.0009765625f}));
  EXPECT_EQ(value_of(amax_out), 100.0f);  // max(50, max |x|)
  // bf16 input and an E5M2 target; dequantised to bf16.
  const Tensor g = raw::to(from_vector(std::vector<float>{-70000.0f, 3.0f}, {2}), DType::bf16);
  const Tensor qg = raw::quantize_fp8(g, scalar(1.0f), DType::f8e5m2);
  EXPECT_EQ(raw::to(raw::dequantize_fp8(qg, scalar(1.0f), DType::bf16), DType::f32).to_vector<float>(),
            (std::vector<float>{-57344.0f, 3.0f}));
}

TEST(Fp8Ops, TransposedCastWritesTheSameCodesTransposed) {
  const Tensor x = random_tensor({5, 7}, DType::f32, 3, -10.0, 10.0);
  const Tensor scale = scalar(20.0f), amax_out = scalar(0.0f);
  const Tensor q = raw::quantize_fp8(x, scale, DType::f8e5m2);
  const raw::Fp8Transposed both = raw::quantize_fp8_transposed(x, scale, DType::f8e5m2, amax_out);
  const auto codes = [](const Tensor& t) {
    const Tensor c = raw::contiguous(t);
    const auto* p = static_cast<const uint8_t*>(c.raw_data());
    return std::vector<uint8_t>(p, p + c.numel());
  };
  EXPECT_EQ(codes(both.q), codes(q));
  EXPECT_EQ(both.qt.shape(), (Shape{7, 5}));
  EXPECT_EQ(codes(both.qt), codes(raw::transpose(q, 0, 1)));
  EXPECT_EQ(value_of(amax_out), value_of(raw::abs_max(x)));
  const raw::Fp8Transposed only_t = raw::quantize_fp8_transposed(x, scale, DType::f8e5m2, Tensor(), false);
  EXPECT_FALSE(only_t.q.defined());
  EXPECT_EQ(codes(only_t.qt), codes(both.qt));
  EXPECT_CPF_ERROR(raw::quantize_fp8_transposed(random_tensor({2, 3, 4}, DType::f32, 1), scale, DType::f8e4m3),
                   "quantize_fp8_transposed: x must be 2-D (R, C), got [2,3,4]");
}

// The column sums a linear's bias gradient takes from the cast of its output gradient: x summed over its
// rows in f64, rounded once to f32; the codes are those of the cast without them; no rows: zeros.
TEST(Fp8Ops, TransposedCastSumsTheColumnsWhenAsked) {
  const Tensor x = random_tensor({9, 6}, DType::bf16, 4, -3.0, 3.0);
  const Tensor scale = scalar(8.0f);
  const raw::Fp8Transposed plain = raw::quantize_fp8_transposed(x, scale, DType::f8e5m2);
  EXPECT_FALSE(plain.column_sums.defined());
  const raw::Fp8Transposed with = raw::quantize_fp8_transposed(x, scale, DType::f8e5m2, Tensor(), false, true);
  ASSERT_EQ(with.column_sums.shape(), (Shape{6}));
  EXPECT_EQ(with.column_sums.dtype(), DType::f32);
  const std::vector<float> sums = with.column_sums.to_vector<float>();
  const std::vector<float> xs = raw::to(x, DType::f32).to_vector<float>();
  for (int64_t c = 0; c < 6; ++c) {
    double expected = 0.0;
    for (int64_t r = 0; r < 9; ++r) expected += xs[r * 6 + c];
    EXPECT_EQ(sums[c], static_cast<float>(expected)) << "column " << c;
  }
  EXPECT_TRUE(testing::same_bytes(with.qt, plain.qt));
  const raw::Fp8Transposed none =
      raw::quantize_fp8_transposed(zeros({0, 3}, {.dtype = DType::bf16}), scale, DType::f8e4m3, Tensor(), true, true);
  EXPECT_EQ(none.column_sums.to_vector<float>(), std::vector<float>(3, 0.0f));
}

TEST(Fp8Ops, AmaxPropagatesNaNAndScaleFallsBackOnIt) {
  EXPECT_EQ(value_of(raw::abs_max(from_vector(std::vector<float>{-7.0f, 2.0f}, {2}))), 7.0f);
  EXPECT_EQ(value_of(raw::abs_max(empty({0}))), 0.0f);
  const Tensor nan_amax = raw::abs_max(from_vector(std::vector<float>{1.0f, NAN, 9.0f}, {3}));
  EXPECT_TRUE(std::isnan(value_of(nan_amax)));
  // scale = 448 / amax / 2^margin; 0 or non-finite amax -> the fallback, or 1.
  EXPECT_FLOAT_EQ(value_of(raw::fp8_scale(scalar(7.0f), DType::f8e4m3)), 64.0f);
  EXPECT_FLOAT_EQ(value_of(raw::fp8_scale(scalar(7.0f), DType::f8e4m3, 2)), 16.0f);
  EXPECT_FLOAT_EQ(value_of(raw::fp8_scale(scalar(2.0f), DType::f8e5m2)), 28672.0f);
  EXPECT_EQ(value_of(raw::fp8_scale(nan_amax, DType::f8e4m3)), 1.0f);
  EXPECT_EQ(value_of(raw::fp8_scale(scalar(0.0f), DType::f8e4m3, 0, scalar(3.5f))), 3.5f);
  EXPECT_EQ(value_of(raw::fp8_scale(scalar(INFINITY), DType::f8e4m3, 0, scalar(3.5f))), 3.5f);
  const Tensor amax_out = scalar(1.0f);
  raw::quantize_fp8(from_vector(std::vector<float>{NAN}, {1}), scalar(1.0f), DType::f8e4m3, amax_out);
  EXPECT_TRUE(std::isnan(value_of(amax_out)));
}

TEST(Fp8Ops, MatmulEqualsTheProductOfTheDecodedValues) {
  const int64_t m = 5, n = 7, k = 32;
  const Tensor x = random_tensor({m, k}, DType::f32, 11);
  const Tensor w = random_tensor({n, k}, DType::f32, 12);
  const Tensor sx = raw::fp8_scale(raw::abs_max(x), DType::f8e4m3);
  const Tensor sw = raw::fp8_scale(raw::abs_max(w), DType::f8e4m3);
  const Tensor xq = raw::quantize_fp8(x, sx, DType::f8e4m3);
  const Tensor wq = raw::quantize_fp8(w, sw, DType::f8e4m3);
  const Tensor sx_inv = scalar(1.0f / value_of(sx)), sw_inv = scalar(1.0f / value_of(sw));
  const Tensor bias = from_vector(std::vector<float>{1, -2, 3, -4, 5, -6, 7}, {n});
  const Tensor y = raw::fp8_matmul_nt(xq, sx_inv, wq, sw_inv, DType::f32, bias);
  // Fast accumulation is a GPU setting: the CPU sums exactly either way.
  EXPECT_EQ(raw::fp8_matmul_nt(xq, sx_inv, wq, sw_inv, DType::f32, bias, true).to_vector<float>(),
            y.to_vector<float>());
  // Naive reference: decoded values times the inverse scales, summed in double.
  const std::vector<float> xd = raw::dequantize_fp8(xq, sx_inv, DType::f32).to_vector<float>();
  const std::vector<float> wd = raw::dequantize_fp8(wq, sw_inv, DType::f32).to_vector<float>();
  const std::vector<float> b = bias.to_vector<float>();
  const std::vector<float> got = y.to_vector<float>();
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < k; ++p) acc += static_cast<double>(xd[i * k + p]) * wd[j * k + p];
      EXPECT_NEAR(got[i * n + j], acc + b[j], 1e-5 * (1 + std::fabs(acc))) << i << "," << j;
    }
  }
  // Close to the unquantised product: E4M3 keeps 3 mantissa bits (relative error <= 1/16 per value).
  const std::vector<float> xf = x.to_vector<float>(), wf = w.to_vector<float>();
  double worst = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double exact = 0, scale = 0;
      for (int64_t p = 0; p < k; ++p) {
        exact += static_cast<double>(xf[i * k + p]) * wf[j * k + p];
        scale += std::fabs(static_cast<double>(xf[i * k + p]) * wf[j * k + p]);
      }
      worst = std::max(worst, std::fabs(got[i * n + j] - b[j] - exact) / scale);
    }
  }
  EXPECT_LT(worst, 0.125);
  // bf16 output: the f32 result rounded once.
  const Tensor y16 = raw::fp8_matmul_nt(xq, sx_inv, wq, sw_inv, DType::bf16, raw::to(bias, DType::bf16));
  EXPECT_TRUE(all_close(raw::to(y16, DType::f32), y, 0.05, 1e-2));
}

TEST(Fp8Ops, Fp8TensorsCopyAsBytesAndRefuseConversions) {
  const Tensor q =
      raw::quantize_fp8(from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3}), scalar(1.0f), DType::f8e4m3);
  const Tensor t = raw::contiguous(raw::transpose(q, 0, 1));  // a strided FP8 copy on the CPU
  EXPECT_EQ(raw::dequantize_fp8(t, scalar(1.0f), DType::f32).to_vector<float>(),
            (std::vector<float>{1, 4, 2, 5, 3, 6}));
  EXPECT_CPF_ERROR(raw::to(q, DType::f32), "copy_: cannot convert f8e4m3 to f32 (FP8 conversions take a scale");
  EXPECT_CPF_ERROR(raw::add(q, q), "f8e4m3 tensors are FP8 GEMM operands: this op does not take them");
  EXPECT_EQ(dtype_from_name("f8e5m2"), DType::f8e5m2);
  EXPECT_EQ(dtype_size(DType::f8e4m3), 1u);
}

TEST(Fp8Ops, RefusesBadOperandsWithTheirNames) {
  const Tensor x = random_tensor({4, 16}, DType::f32, 1);
  const Tensor one = scalar(1.0f);
  const Tensor q4 = raw::quantize_fp8(x, one, DType::f8e4m3);
  const Tensor q5 = raw::quantize_fp8(x, one, DType::f8e5m2);
  EXPECT_CPF_ERROR(raw::quantize_fp8(x, one, DType::bf16), "quantize_fp8: the target dtype must be f8e4m3 or f8e5m2");
  EXPECT_CPF_ERROR(raw::quantize_fp8(raw::to(x, DType::f64), one, DType::f8e4m3),
                   "quantize_fp8: x must be f32 or bf16, got f64");
  EXPECT_CPF_ERROR(raw::quantize_fp8(x, from_vector(std::vector<float>{1, 2}, {2}), DType::f8e4m3),
                   "quantize_fp8: scale must be a () f32 tensor, got shape [2]");
  EXPECT_CPF_ERROR(raw::quantize_fp8(x, Tensor(), DType::f8e4m3), "quantize_fp8: scale is undefined");
  EXPECT_CPF_ERROR(raw::dequantize_fp8(x, one, DType::f32), "dequantize_fp8: q must be f8e4m3 or f8e5m2, got f32");
  EXPECT_CPF_ERROR(raw::dequantize_fp8(q4, one, DType::f64), "dequantize_fp8: the output dtype must be f32 or bf16");
  EXPECT_CPF_ERROR(raw::fp8_matmul_nt(q5, one, q5, one, DType::bf16), "fp8_matmul_nt: a and b are both f8e5m2");
  EXPECT_CPF_ERROR(
      raw::fp8_matmul_nt(q4, one, raw::quantize_fp8(random_tensor({4, 8}, DType::f32, 2), one, DType::f8e4m3), one,
                         DType::bf16),
      "fp8_matmul_nt: a (M, K) and b (N, K) must share K, got [4,16] and [4,8]");
  EXPECT_CPF_ERROR(raw::fp8_matmul_nt(raw::transpose(q4, 0, 1), one, raw::transpose(q4, 0, 1), one, DType::bf16),
                   "fp8_matmul_nt: a and b must be contiguous (K-major)");
  EXPECT_CPF_ERROR(raw::fp8_matmul_nt(q4, one, q4, one, DType::f64), "fp8_matmul_nt: the output dtype must be bf16");
  EXPECT_CPF_ERROR(raw::fp8_matmul_nt(q4, one, q4, one, DType::bf16, empty({4})),
                   "fp8_matmul_nt: bias must be a contiguous (4) bf16 tensor");
  EXPECT_CPF_ERROR(raw::fp8_scale(one, DType::f32), "fp8_max: the dtype must be f8e4m3 or f8e5m2, got f32");
  EXPECT_CPF_ERROR(raw::fp8_scale(one, DType::f8e4m3, -1), "fp8_scale: margin must be in [0, 64], got -1");
  EXPECT_CPF_ERROR(raw::abs_max(from_vector(std::vector<int32_t>{1}, {1})),
                   "abs_max: x must be f32, bf16 or f64, got i32");
}

}  // namespace
}  // namespace cpf
