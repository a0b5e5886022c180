#pragma once
// Helpers shared by the row kernels of the nn ops (norm.cu, cross_entropy.cu; nvcc only): a row of up
// to kWarpRowLimit elements gets a warp, a longer one a block; group reductions over a warp or a block;
// vector loads of a row widened to the compute type; grid sizes.
#include "framework/tensor/cuda/device_math.cuh"
#include "framework/tensor/cuda/elementwise.cuh"

namespace cpf::cuda::kernels::row_helpers {

constexpr int64_t kWarpRowLimit = 1024;

// Sum (or max) over a group of G threads (G = 32: a warp; G = kThreads: the block); every thread
// gets the result. `scratch` holds kThreads / 32 values (block groups only).
template <int G, bool is_max, class C>
__device__ __forceinline__ C group_reduce(C v, C* scratch) {
#pragma unroll
  for (int delta = 16; delta > 0; delta >>= 1) {
    const C o = __shfl_xor_sync(0xffffffffu, v, delta);
    v = is_max ? (o > v ? o : v) : v + o;
  }
  if constexpr (G > 32) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();  // scratch may still be read by a previous reduction
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < G / 32 ? scratch[lane] : (is_max ? -C(INFINITY) : C(0));
#pragma unroll
    for (int delta = 16; delta > 0; delta >>= 1) {
      const C o = __shfl_xor_sync(0xffffffffu, v, delta);
      v = is_max ? (o > v ? o : v) : v + o;
    }
  }
  return v;
}

// Row index and lane of this thread for a G-thread group per row (grid-stride over rows).
template <int G>
struct RowLoop {
  int64_t first, step;
  int lane;
  __device__ RowLoop() {
    if constexpr (G == 32) {
      first = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
      step = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
      lane = threadIdx.x & 31;
    } else {
      first = blockIdx.x;
      step = gridDim.x;
      lane = threadIdx.x;
    }
  }
};

template <class T>
__device__ __forceinline__ compute_t<T> ld(const T* p, int64_t i) {
  return widen(p[i]);
}

// V elements per access (16-byte vectors when the row length and every base allow it; V = 1 otherwise).
template <class T, int V>
__device__ __forceinline__ void load_row_vec(const T* p, int64_t q, compute_t<T> (&out)[V]) {
  const Vec<T, V> v = *reinterpret_cast<const Vec<T, V>*>(p + q * V);
#pragma unroll
  for (int k = 0; k < V; ++k) out[k] = widen(v.v[k]);
}

inline int64_t capped(int64_t blocks) {
  constexpr int64_t cap = 65535 * 16;
  return blocks < 1 ? 1 : (blocks < cap ? blocks : cap);
}

inline int64_t row_grid(int64_t rows, int64_t cols) {
  return cols <= kWarpRowLimit ? capped((rows + kThreads / 32 - 1) / (kThreads / 32)) : capped(rows);
}

}  // namespace cpf::cuda::kernels::row_helpers
