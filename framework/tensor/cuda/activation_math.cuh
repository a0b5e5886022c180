#pragma once
// The activations' formulas as device functions (nvcc only), shared by the kernels that apply them: the
// element-wise GELU (unary.cu), SwiGLU's gate (swiglu.cu) and the FP8 casts that apply an activation on
// the way (fp8.cu). One definition keeps those kernels' values equal bit for bit: an FP8 linear fed by a
// fused GELU cast reads the codes the unfused GELU-then-cast would have written.
#include <cuda_runtime.h>

namespace cpf::cuda::kernels {

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kGeluCoeff = 0.044715;

// 1 / (1 + exp(-z)). In f32 (f32 and bf16 tensors) through the hardware exp2 and a fast divide: a few
// ulps, far below f32 tolerance and bf16 rounding, and 3x fewer instructions than tanhf, which kept
// bf16 gelu compute-bound. f64 stays exact.
__device__ __forceinline__ float logistic(float z) { return __fdividef(1.0f, 1.0f + __expf(-z)); }
__device__ __forceinline__ double logistic(double z) { return 1.0 / (1.0 + exp(-z)); }

// GELU, tanh approximation: 0.5 x (1 + tanh(u)) = x logistic(2u), without 1 + tanh's cancellation for x < 0.
template <class C>
__device__ __forceinline__ C gelu_tanh(C x) {
  return x * logistic(C(2 * kSqrt2OverPi) * (x + C(kGeluCoeff) * x * x * x));
}

// SwiGLU's sigmoid, with the precise exp (its backward reuses it).
__device__ __forceinline__ float swiglu_sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }
__device__ __forceinline__ double swiglu_sigmoid(double g) { return 1.0 / (1.0 + exp(-g)); }

// silu(g) * u.
template <class C>
__device__ __forceinline__ C swiglu_value(C g, C u) {
  return g * swiglu_sigmoid(g) * u;
}

}  // namespace cpf::cuda::kernels
