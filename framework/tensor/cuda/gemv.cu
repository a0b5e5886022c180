// Few-row GEMM as GEMV (launch_gemv, kernels.cuh): out (M, N) = a (M, K) @ w (N, K)^T [+ bias], with GELU
// (pre-activation kept in aux) when asked, for M <= kGemvMaxRows. A decoding step multiplies one row per
// sequence by every weight, so the step is bound by reading the weights once; cuBLASLt's kernels for one
// row split K over blocks and add a reduction kernel (docs/generation.md's profile). Here a warp owns an
// output column: its lanes stream the weight row with 16-byte loads, keep one f32 sum per input row, add
// them across the warp and finish the column (bias, rounding, GELU) in the same kernel. Each output is
// one fixed-order sum: deterministic, and one kernel in a captured graph.
#include "framework/tensor/cuda/elementwise.cuh"

namespace cpf::cuda::kernels {
namespace {

constexpr int kGemvWarps = 8;  // output columns per block

__device__ __forceinline__ float warp_total(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// cpformer's GELU (the tanh approximation), in f32: x * logistic(2u) = 0.5 x (1 + tanh(u)).
__device__ __forceinline__ float gelu_tanh(float x) {
  const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  return x * __fdividef(1.0f, 1.0f + __expf(-2.0f * u));
}

// R: rows handled (a compile-time bound; m <= R). V: elements per 16-byte load.
template <class T, int R>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_kernel(GemvLaunch g) {
  constexpr int V = 16 / static_cast<int>(sizeof(T));
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kGemvWarps + warp;
  if (col >= g.n) return;
  const T* w = static_cast<const T*>(g.w) + col * g.k;  // (K) row of the weight
  const T* a = static_cast<const T*>(g.a);
  float sum[R];
#pragma unroll
  for (int r = 0; r < R; ++r) sum[r] = 0.0f;
  const int64_t vectors = g.k / V;
#pragma unroll 4
  for (int64_t q = lane; q < vectors; q += 32) {
    const Vec<T, V> wv = *reinterpret_cast<const Vec<T, V>*>(w + q * V);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (r >= g.m) break;
      const Vec<T, V> av = *reinterpret_cast<const Vec<T, V>*>(a + r * g.lda + q * V);
#pragma unroll
      for (int j = 0; j < V; ++j) sum[r] += static_cast<float>(widen(wv.v[j])) * static_cast<float>(widen(av.v[j]));
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) sum[r] = warp_total(sum[r]);
  if (lane != 0) return;
  const float bias = g.bias != nullptr ? static_cast<float>(widen(static_cast<const T*>(g.bias)[col])) : 0.0f;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (r >= g.m) break;
    const T pre = narrow<T>(static_cast<compute_t<T>>(sum[r] + bias));
    const int64_t at = r * g.n + col;
    if (g.gelu) {
      // GELU of the rounded pre-activation, as the unfused path (linear, then gelu) computes it.
      static_cast<T*>(g.aux)[at] = pre;
      static_cast<T*>(g.out)[at] = narrow<T>(static_cast<compute_t<T>>(gelu_tanh(static_cast<float>(widen(pre)))));
    } else {
      static_cast<T*>(g.out)[at] = pre;
    }
  }
}

template <class T>
void launch_typed(const GemvLaunch& g, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((g.n + kGemvWarps - 1) / kGemvWarps));
  const dim3 block(kGemvWarps * 32);
  if (g.m <= 1) {
    gemv_kernel<T, 1><<<grid, block, 0, stream>>>(g);
  } else if (g.m <= 2) {
    gemv_kernel<T, 2><<<grid, block, 0, stream>>>(g);
  } else if (g.m <= 4) {
    gemv_kernel<T, 4><<<grid, block, 0, stream>>>(g);
  } else {
    gemv_kernel<T, kGemvMaxRows><<<grid, block, 0, stream>>>(g);
  }
  CPF_CUDA_CHECK_LAUNCH("gemv kernel");
}

}  // namespace

void launch_gemv(const GemvLaunch& g, cudaStream_t stream) {
  CPF_CHECK(g.m >= 1 && g.m <= kGemvMaxRows && g.n >= 1 && g.k >= 1, "gemv: ", g.m, " rows (1-", kGemvMaxRows, "), N ",
            g.n, ", K ", g.k, " (internal: matmul_gemv.cpp checks these)");
  switch (g.dtype) {
    case kF32: return launch_typed<float>(g, stream);
    case kBF16: return launch_typed<bf16>(g, stream);
    default: CPF_FAIL("gemv: dtype code ", g.dtype, " (f32 or bf16 only)");
  }
}

}  // namespace cpf::cuda::kernels
