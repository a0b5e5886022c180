// Binary arithmetic (and add_'s scaled add), comparisons, where and mul_'s scaling. Formulas and
// rounding mirror framework/tensor/ops/elementwise.cpp; op codes are kernels.cuh's
// BinaryCode / CompareCode (raw::BinaryOp / CompareOp values).
#include "framework/tensor/cuda/elementwise.cuh"

namespace cpf::cuda::kernels {
namespace {

__device__ __forceinline__ float m_pow(float a, float b) { return powf(a, b); }
__device__ __forceinline__ double m_pow(double a, double b) { return pow(a, b); }

// a + alpha * b with both operations rounded separately (no fused multiply-add), as on the CPU.
__device__ __forceinline__ float add_scaled(float a, float alpha, float b) { return __fadd_rn(a, __fmul_rn(alpha, b)); }
__device__ __forceinline__ double add_scaled(double a, double alpha, double b) {
  return __dadd_rn(a, __dmul_rn(alpha, b));
}

template <class C>
__device__ __forceinline__ C binary_value(int op, C a, C b, C alpha, int* div_by_zero) {
  if constexpr (std::is_integral_v<C>) {
    using U = std::make_unsigned_t<C>;  // signed overflow wraps, as on the CPU
    switch (op) {
      case kAdd: return static_cast<C>(static_cast<U>(a) + static_cast<U>(b));
      case kSub: return static_cast<C>(static_cast<U>(a) - static_cast<U>(b));
      case kMul: return static_cast<C>(static_cast<U>(a) * static_cast<U>(b));
      case kDiv:
        if (b == 0) {
          *div_by_zero = 1;
          return C(0);
        }
        if (b == C(-1)) return static_cast<C>(U(0) - static_cast<U>(a));  // INT_MIN / -1 wraps
        return a / b;
      case kPow: return static_cast<C>(pow(static_cast<double>(a), static_cast<double>(b)));
      case kMaximum: return a > b ? a : b;
      case kMinimum: return a < b ? a : b;
      case kAddScaled: return static_cast<C>(static_cast<U>(a) + static_cast<U>(alpha) * static_cast<U>(b));
      default: return a;
    }
  } else {
    switch (op) {
      case kAdd: return a + b;
      case kSub: return a - b;
      case kMul: return a * b;
      case kDiv: return a / b;
      case kPow: return m_pow(a, b);
      // NaN wins, as in numpy/PyTorch.
      case kMaximum: return (a > b || isnan(a)) ? a : b;
      case kMinimum: return (a < b || isnan(a)) ? a : b;
      case kAddScaled: return add_scaled(a, alpha, b);
      default: return a;
    }
  }
}

template <class T>
struct BinaryFn {
  int op;
  compute_t<T> alpha;
  int* div_by_zero;
  __device__ T operator()(T a, T b) const {
    return narrow<T>(binary_value<compute_t<T>>(op, widen(a), widen(b), alpha, div_by_zero));
  }
};

template <class T>
struct CompareFn {
  int op;
  __device__ bool operator()(T a, T b) const {
    const auto x = widen(a);
    const auto y = widen(b);
    switch (op) {
      case kEq: return x == y;
      case kNe: return x != y;
      case kLt: return x < y;
      case kLe: return x <= y;
      case kGt: return x > y;
      default: return x >= y;
    }
  }
};

template <class T>
struct WhereFn {
  __device__ T operator()(bool c, T a, T b) const { return c ? a : b; }
};

template <class T>
struct ScaleFn {
  double value;
  __device__ T operator()(T x) const {
    if constexpr (std::is_same_v<T, bf16>) {
      return to_bf16(__fmul_rn(to_float(x), static_cast<float>(value)));
    } else {
      return static_cast<T>(__dmul_rn(static_cast<double>(x), value));
    }
  }
};

}  // namespace

void launch_binary(int op, const Iter& it, double alpha, int* div_by_zero, cudaStream_t stream) {
  visit_arithmetic(it.dtype[0], [&]<class T>() {
    using C = compute_t<T>;
    launch<T, T, T>(it, BinaryFn<T>{op, static_cast<C>(alpha), div_by_zero}, stream, "binary kernel");
  });
}

void launch_compare(int op, const Iter& it, cudaStream_t stream) {
  if (it.dtype[1] == kBool) return launch<bool, bool, bool>(it, CompareFn<bool>{op}, stream, "compare kernel");
  visit_arithmetic(it.dtype[1], [&]<class T>() { launch<bool, T, T>(it, CompareFn<T>{op}, stream, "compare kernel"); });
}

void launch_where(const Iter& it, cudaStream_t stream) {
  switch (it.dtype[0]) {
    case kF32:
    case kI32: return launch<uint32_t, bool, uint32_t, uint32_t>(it, WhereFn<uint32_t>{}, stream, "where kernel");
    case kF64:
    case kI64: return launch<uint64_t, bool, uint64_t, uint64_t>(it, WhereFn<uint64_t>{}, stream, "where kernel");
    case kBF16: return launch<uint16_t, bool, uint16_t, uint16_t>(it, WhereFn<uint16_t>{}, stream, "where kernel");
    default: return launch<bool, bool, bool, bool>(it, WhereFn<bool>{}, stream, "where kernel");
  }
}

void launch_scale(const Iter& it, double value, cudaStream_t stream) {
  visit_arithmetic(it.dtype[0], [&]<class T>() { launch<T, T>(it, ScaleFn<T>{value}, stream, "mul_ kernel"); });
}

}  // namespace cpf::cuda::kernels
