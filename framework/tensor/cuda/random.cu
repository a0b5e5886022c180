// Philox draws on the device (framework/tensor/random.cpp): one thread per element computes the f64
// value the CPU computes for Philox block (seed, first + i), with the same helpers (philox.h is
// host/device). Uniform and randint use only exact integer work and IEEE-rounded + and * (written as
// __dmul_rn / __dadd_rn so nvcc cannot contract them into an FMA the CPU does not use), so they are
// bit-identical to the CPU. Normal goes through CUDA's double log/cos (1 and 2 ulp bounds) where the
// CPU uses libm's: equal in almost every element, otherwise a few f64 ulps apart.
#include <cmath>

#include "framework/core/philox.h"
#include "framework/tensor/cuda/elementwise.cuh"

namespace cpf::cuda::kernels {
namespace {

// random.cpp's below_high: a value that rounds up to `high` in f32/bf16 moves one step below.
__device__ double below_high(double v, double high, int dtype) {
  if (dtype == kF32) {
    const float f = __double2float_rn(v);
    return f < high ? f : nextafterf(f, -INFINITY);
  }
  if (dtype == kBF16) {
    bf16 b = to_bf16(__double2float_rn(v));
    if (to_float(b) < high) return to_float(b);
    if (b.bits == 0x0000) return to_float(bf16{0x8001});
    b.bits = (b.bits & 0x8000) ? static_cast<uint16_t>(b.bits + 1) : static_cast<uint16_t>(b.bits - 1);
    return to_float(b);
  }
  return v;
}

__global__ void philox_kernel(PhiloxParams p, double* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const PhiloxBlock b = philox_block(p.seed, p.first + static_cast<uint64_t>(i));
    double v;
    if (p.op == kPhiloxUniform) {
      const double u = __dadd_rn(p.a, __dmul_rn(__dsub_rn(p.b, p.a), uniform_double(b)));
      v = p.a == p.b ? p.a : below_high(u, p.b, p.dtype);
    } else if (p.op == kPhiloxNormal) {
      v = __dadd_rn(p.a, __dmul_rn(p.b, normal_double(b)));
    } else {
      const uint64_t bits = (static_cast<uint64_t>(b[0]) << 32) | b[1];
      v = static_cast<double>(p.low + static_cast<int64_t>(bits % p.span));
    }
    out[i] = v;
  }
}

}  // namespace

void launch_philox(const PhiloxParams& params, double* out, int64_t n, int sm_count, cudaStream_t stream) {
  if (n == 0) return;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  const int grid = static_cast<int>(blocks < 32LL * sm_count ? blocks : 32LL * sm_count);
  philox_kernel<<<grid, kThreads, 0, stream>>>(params, out, n);
  CPF_CUDA_CHECK_LAUNCH("philox kernel");
}

}  // namespace cpf::cuda::kernels
