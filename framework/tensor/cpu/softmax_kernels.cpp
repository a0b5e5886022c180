#include "framework/tensor/cpu/softmax_kernels.h"

#include <cmath>
#include <cstring>
#include <limits>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define CPF_SOFTMAX_X86_DISPATCH 1
#endif

namespace cpf::cpu {
namespace {

template <int W>
struct Lanes;
template <>
struct Lanes<4> {
  typedef float F __attribute__((vector_size(16)));
  typedef int32_t I __attribute__((vector_size(16)));
  typedef uint32_t U __attribute__((vector_size(16)));
};
template <>
struct Lanes<8> {
  typedef float F __attribute__((vector_size(32)));
  typedef int32_t I __attribute__((vector_size(32)));
  typedef uint32_t U __attribute__((vector_size(32)));
};

// Cephes expf: exp(x) = 2^n * exp(r) with n = round(x / ln 2) and |r| <= ln(2) / 2, exp(r) from a
// degree-6 polynomial, ln 2 split in two constants so r is exact. Arguments below ln(FLT_MIN) give 0,
// above 88 give +inf (softmax arguments are <= 0).
template <int W>
[[gnu::always_inline]] inline void vexp(const typename Lanes<W>::F& arg, typename Lanes<W>::F& result) {
  using F = typename Lanes<W>::F;
  using I = typename Lanes<W>::I;
  using U = typename Lanes<W>::U;  // bit patterns: unsigned, so NaN lanes wrap instead of overflowing
  F x = arg;
  const F zero = {};
  const F lo = zero - 87.33654475f, hi = zero + 88.0f;
  const I under = x < lo;
  const I over = x > hi;
  x = under ? lo : x;
  x = over ? hi : x;
  // Adding 1.5 * 2^23 rounds to the nearest integer; its low mantissa bits then hold n.
  const F shifted = x * 1.44269504088896341f + 12582912.0f;
  const F n = shifted - 12582912.0f;
  // Bit reinterpretations through memcpy (std::bit_cast would return 32-byte vectors by value, which GCC
  // flags as an ABI change outside AVX code).
  U bits;
  std::memcpy(&bits, &shifted, sizeof(U));
  bits = ((bits - 0x4B400000u) + 127u) << 23;
  F scale;
  std::memcpy(&scale, &bits, sizeof(F));
  F r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  F p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  F y = p * scale;
  y = under ? zero : y;
  result = over ? zero + std::numeric_limits<float>::infinity() : y;
}

// One routine for both entry points: shifts == nullptr means the scalar `shift`. The ragged tail runs
// through the same vector code (padding lanes are dropped before the sum), so every element gets the
// same rounding whatever its position.
template <int W>
[[gnu::always_inline]] inline float exp_rows(const float* x, float shift, const float* shifts, float* out, int64_t n) {
  using F = typename Lanes<W>::F;
  const F zero = {};
  F acc = zero;
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    F v, s = zero + shift;
    std::memcpy(&v, x + i, sizeof(F));
    if (shifts) std::memcpy(&s, shifts + i, sizeof(F));
    F e;
    vexp<W>(v - s, e);
    if (out) std::memcpy(out + i, &e, sizeof(F));
    acc += e;
  }
  if (i < n) {
    const size_t bytes = static_cast<size_t>(n - i) * sizeof(float);
    F v = zero, s = zero + shift, tail = zero;
    std::memcpy(&v, x + i, bytes);
    if (shifts) std::memcpy(&s, shifts + i, bytes);
    F e;
    vexp<W>(v - s, e);
    std::memcpy(&tail, &e, bytes);
    if (out) std::memcpy(out + i, &tail, bytes);
    acc += tail;
  }
  float sum = 0;
  for (int k = 0; k < W; ++k) sum += acc[k];
  return sum;
}

#if defined(CPF_SOFTMAX_X86_DISPATCH)
__attribute__((target("avx2,fma"))) float exp_rows_avx2(const float* x, float shift, const float* shifts, float* out,
                                                        int64_t n) {
  return exp_rows<8>(x, shift, shifts, out, n);
}

bool use_avx2() {
  static const bool supported = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return supported;
}
#endif

float exp_rows_f32(const float* x, float shift, const float* shifts, float* out, int64_t n) {
#if defined(CPF_SOFTMAX_X86_DISPATCH)
  if (use_avx2()) return exp_rows_avx2(x, shift, shifts, out, n);
#endif
  return exp_rows<4>(x, shift, shifts, out, n);
}

}  // namespace

float exp_sum(const float* x, float shift, float* out, int64_t n) { return exp_rows_f32(x, shift, nullptr, out, n); }

void exp_sub(const float* x, const float* shift, float* out, int64_t n) { exp_rows_f32(x, 0.0f, shift, out, n); }

double exp_sum(const double* x, double shift, double* out, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double e = std::exp(x[i] - shift);
    if (out) out[i] = e;
    sum += e;
  }
  return sum;
}

void exp_sub(const double* x, const double* shift, double* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = std::exp(x[i] - shift[i]);
}

}  // namespace cpf::cpu
