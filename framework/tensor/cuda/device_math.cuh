#pragma once
// Math overloads for the kernels' compute types (f32 for f32/bf16, f64 for f64; nvcc only), so a
// kernel templated on the compute type calls one name and gets expf or exp. Shared by the
// element-wise, reduction, softmax and row (norm, cross-entropy) kernels.
#include <cuda_runtime.h>

namespace cpf::cuda::kernels {

__device__ __forceinline__ float m_exp(float x) { return expf(x); }
__device__ __forceinline__ double m_exp(double x) { return exp(x); }
__device__ __forceinline__ float m_log(float x) { return logf(x); }
__device__ __forceinline__ double m_log(double x) { return log(x); }
__device__ __forceinline__ float m_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double m_sqrt(double x) { return sqrt(x); }

}  // namespace cpf::cuda::kernels
