#pragma once
// Exponential row primitives shared by the CPU softmax, log-softmax and cross-entropy kernels.
//
// The f32 versions use a SIMD exp (GCC/Clang vector extensions, 8 lanes on CPUs with AVX2+FMA chosen
// at run time, 4 lanes otherwise) because Eigen's portable SSE2 exp is 3-4x slower and softmax is
// exp-bound. It is accurate to about 2 ulp; results that would be subnormal (arguments below -87.34)
// are flushed to 0, and exp(-inf) is exactly 0 (masked entries get exactly zero probability). The f64
// versions call std::exp (f64 is the gradcheck dtype, not a performance path). A NaN argument gives NaN.
#include <cstdint>

namespace cpf::cpu {

// out[i] = exp(x[i] - shift) for i < n; returns the sum of those values. out may be null (sum only) or
// equal to x.
float exp_sum(const float* x, float shift, float* out, int64_t n);
double exp_sum(const double* x, double shift, double* out, int64_t n);

// out[i] = exp(x[i] - shift[i]) for i < n (a per-element shift); out may equal x.
void exp_sub(const float* x, const float* shift, float* out, int64_t n);
void exp_sub(const double* x, const double* shift, double* out, int64_t n);

}  // namespace cpf::cpu
