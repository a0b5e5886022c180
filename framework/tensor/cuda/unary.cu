// Unary math and its backward. Formulas mirror framework/tensor/ops/elementwise.cpp; op codes are
// kernels.cuh's UnaryCode (raw::UnaryOp's values).
#include "framework/tensor/cuda/activation_math.cuh"
#include "framework/tensor/cuda/device_math.cuh"
#include "framework/tensor/cuda/elementwise.cuh"

namespace cpf::cuda::kernels {
namespace {

__device__ __forceinline__ float m_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double m_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float m_abs(float x) { return fabsf(x); }
__device__ __forceinline__ double m_abs(double x) { return fabs(x); }

template <class C>
__device__ __forceinline__ C unary_value(int op, C x) {
  if constexpr (std::is_integral_v<C>) {
    using U = std::make_unsigned_t<C>;  // wrap on overflow, as the CPU does
    switch (op) {
      case kNeg: return static_cast<C>(U(0) - static_cast<U>(x));
      case kAbs: return x < 0 ? static_cast<C>(U(0) - static_cast<U>(x)) : x;
      case kSquare: return static_cast<C>(static_cast<U>(x) * static_cast<U>(x));
      default: return x;  // rejected by the raw op: integers only support neg, abs and square
    }
  } else {
    switch (op) {
      case kNeg: return -x;
      case kExp: return m_exp(x);
      case kLog: return m_log(x);
      case kSqrt: return m_sqrt(x);
      case kRsqrt: return C(1) / m_sqrt(x);
      case kTanh: return m_tanh(x);
      case kGelu: return gelu_tanh(x);  // activation_math.cuh
      case kSilu: return x * logistic(x);
      case kRelu: return x > C(0) ? x : C(0);
      case kSigmoid: return logistic(x);
      case kAbs: return m_abs(x);
      case kSquare: return x * x;
      case kReciprocal: return C(1) / x;
      default: return x;
    }
  }
}

template <class C>
__device__ __forceinline__ C unary_derivative(int op, C x, C y) {
  switch (op) {
    case kNeg: return C(-1);
    case kExp: return y;
    case kLog: return C(1) / x;
    case kSqrt: return C(0.5) / y;
    case kRsqrt: return C(-0.5) * y * y * y;
    case kTanh: return C(1) - y * y;
    case kGelu: {
      const C inner = C(kSqrt2OverPi) * (x + C(kGeluCoeff) * x * x * x);
      const C t = m_tanh(inner);
      return C(0.5) * (C(1) + t) + C(0.5) * x * (C(1) - t * t) * C(kSqrt2OverPi) * (C(1) + C(3 * kGeluCoeff) * x * x);
    }
    case kSilu: {
      const C s = C(1) / (C(1) + m_exp(-x));
      return s * (C(1) + x * (C(1) - s));
    }
    case kRelu: return x > C(0) ? C(1) : C(0);
    case kSigmoid: return y * (C(1) - y);
    case kAbs: return x > C(0) ? C(1) : (x < C(0) ? C(-1) : C(0));
    case kSquare: return C(2) * x;
    case kReciprocal: return -y * y;
    default: return C(0);
  }
}

template <class T>
struct UnaryFn {
  int op;
  __device__ T operator()(T x) const { return narrow<T>(unary_value<compute_t<T>>(op, widen(x))); }
};

// The op fixed at compile time: the per-element switch on a runtime op folds away. Used for the
// activations of the model (gelu, silu, relu) and exp on floating tensors, where that switch was a
// large share of the instructions per element of a bf16 tensor (2 bytes of traffic per element).
template <class T, int Op>
struct FixedUnaryFn {
  __device__ T operator()(T x) const { return narrow<T>(unary_value<compute_t<T>>(Op, widen(x))); }
};

template <class T>
struct UnaryBackwardFn {
  int op;
  __device__ T operator()(T g, T x, T y) const {
    return narrow<T>(widen(g) * unary_derivative<compute_t<T>>(op, widen(x), widen(y)));
  }
};

}  // namespace

void launch_unary(int op, const Iter& it, cudaStream_t stream) {
  visit_arithmetic(it.dtype[0], [&]<class T>() {
    if constexpr (!std::is_integral_v<T>) {
      switch (op) {
        case kGelu: return launch<T, T>(it, FixedUnaryFn<T, kGelu>{}, stream, "unary kernel (gelu)");
        case kSilu: return launch<T, T>(it, FixedUnaryFn<T, kSilu>{}, stream, "unary kernel (silu)");
        case kRelu: return launch<T, T>(it, FixedUnaryFn<T, kRelu>{}, stream, "unary kernel (relu)");
        case kExp: return launch<T, T>(it, FixedUnaryFn<T, kExp>{}, stream, "unary kernel (exp)");
        default: break;
      }
    }
    launch<T, T>(it, UnaryFn<T>{op}, stream, "unary kernel");
  });
}

void launch_unary_backward(int op, const Iter& it, cudaStream_t stream) {
  visit_floating(it.dtype[0],
                 [&]<class T>() { launch<T, T, T, T>(it, UnaryBackwardFn<T>{op}, stream, "unary backward kernel"); });
}

}  // namespace cpf::cuda::kernels
