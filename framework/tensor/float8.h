#pragma once
// FP8 storage types, the two 8-bit formats Hopper's tensor cores read (OCP FP8; CUDA's __nv_fp8_e4m3 and
// __nv_fp8_e5m2):
//
//   float8_e4m3  s eeee mmm   bias 7,  largest finite 448,   no infinities, s 1111 111 is NaN
//   float8_e5m2  s eeeee mm   bias 15, largest finite 57344, infinities and NaNs as in IEEE
//
// E4M3 has the precision for weights and activations, E5M2 the range for gradients. Conversion from
// float rounds to nearest even and saturates: a value beyond the largest finite one (infinity included)
// becomes that value with its sign, as CUDA's __NV_SATFINITE cast does, because a scaled cast that
// overflows should clip, not poison the GEMM. NaN stays NaN. Arithmetic happens in float; nothing in
// the project computes in FP8 except the FP8 GEMM (framework/tensor/ops/fp8.h).
#include <cmath>
#include <cstdint>

namespace cpf {

namespace fp8_detail {

// The value of an FP8 code with `mant_bits` mantissa bits and exponent bias `bias`; `ieee_top`: the
// top exponent holds infinities and NaNs (E5M2) rather than finite values and one NaN (E4M3).
inline float decode(uint8_t bits, int mant_bits, int bias, bool ieee_top) {
  const int exp_bits = 7 - mant_bits;
  const int exp_field = (bits >> mant_bits) & ((1 << exp_bits) - 1);
  const int mant = bits & ((1 << mant_bits) - 1);
  const float sign = (bits & 0x80) ? -1.0f : 1.0f;
  const int top = (1 << exp_bits) - 1;
  if (ieee_top && exp_field == top) return mant == 0 ? sign * INFINITY : NAN;
  if (!ieee_top && exp_field == top && mant == (1 << mant_bits) - 1) return NAN;
  if (exp_field == 0) return sign * std::ldexp(static_cast<float>(mant), 1 - bias - mant_bits);  // subnormal
  return sign * std::ldexp(static_cast<float>(mant + (1 << mant_bits)), exp_field - bias - mant_bits);
}

// The code of `value` rounded to nearest even, saturated to +-max_finite; nan_code for NaN.
inline uint8_t encode(float value, int mant_bits, int bias, float max_finite, uint8_t nan_code) {
  if (std::isnan(value)) return nan_code;
  const uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
  double a = std::fabs(static_cast<double>(value));
  if (a > max_finite) a = max_finite;  // infinity included (saturation); rounding cannot go above it then
  const int min_exp = 1 - bias;        // the exponent of the smallest normal value
  // The quantum at a's binade (the subnormals share the smallest normal binade's), then a rounded to
  // it: a / quantum is exact in double (a is a float, the quantum a power of two).
  int e = a > 0 ? std::ilogb(a) : min_exp;
  if (e < min_exp) e = min_exp;
  const double quantum = std::ldexp(1.0, e - mant_bits);
  a = std::nearbyint(a / quantum) * quantum;  // round half to even (the default rounding mode)
  if (a == 0) return sign;
  e = std::ilogb(a);  // rounding may have carried into the next binade
  if (e < min_exp) return static_cast<uint8_t>(sign | static_cast<int>(a / std::ldexp(1.0, min_exp - mant_bits)));
  const int mant = static_cast<int>(a / std::ldexp(1.0, e - mant_bits)) - (1 << mant_bits);
  return static_cast<uint8_t>(sign | ((e + bias) << mant_bits) | mant);
}

// The largest finite value: the top exponent and mantissa that are not infinity or NaN (E4M3's top
// exponent is finite except for its all-ones mantissa; E5M2's top exponent is all infinities and NaNs).
constexpr float max_finite(int mant_bits, int bias, bool ieee_top) {
  const int top_exp = (1 << (7 - mant_bits)) - (ieee_top ? 2 : 1);
  const int top_mant = (1 << mant_bits) - (ieee_top ? 1 : 2);
  float v = static_cast<float>((1 << mant_bits) + top_mant) / static_cast<float>(1 << mant_bits);
  for (int i = 0; i < top_exp - bias; ++i) v *= 2.0f;
  return v;
}

}  // namespace fp8_detail

// One FP8 format: kMantBits mantissa bits, exponent bias kBias; kIeeeTop: the top exponent holds
// infinities and NaNs (E5M2) rather than finite values and one NaN (E4M3).
template <int kMantBits, int kBias, bool kIeeeTop>
struct float8 {
  static constexpr float kMax = fp8_detail::max_finite(kMantBits, kBias, kIeeeTop);
  uint8_t bits = 0;

  float8() = default;
  explicit float8(float value) : bits(fp8_detail::encode(value, kMantBits, kBias, kMax, 0x7f)) {}
  explicit operator float() const { return fp8_detail::decode(bits, kMantBits, kBias, kIeeeTop); }
  static float8 from_bits(uint8_t raw) {
    float8 out;
    out.bits = raw;
    return out;
  }
};

using float8_e4m3 = float8<3, 7, false>;
using float8_e5m2 = float8<2, 15, true>;
static_assert(float8_e4m3::kMax == 448.0f && float8_e5m2::kMax == 57344.0f);

}  // namespace cpf
