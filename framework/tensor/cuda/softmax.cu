// Softmax, log-softmax and their backward over one dim of a contiguous (outer, size, inner) tensor
// (op codes: kernels.cuh's SoftmaxCode, DeviceSoftmaxOp's values). inner == 1: a warp per row
// (size <= 1024) or a block per row; otherwise one thread per (outer, inner) column, adjacent threads
// on adjacent columns so every step along the softmax dim is a coalesced load. Forward rows of up to 1024 are held in
// registers (one read, one exp, one write per element); longer rows and the backward ops are reduced in one pass as an
// online (max, sum) pair. Fully masked rows (all -inf) give softmax 0 and log_softmax -inf.
#include "framework/tensor/cuda/device_math.cuh"
#include "framework/tensor/cuda/elementwise.cuh"

namespace cpf::cuda::kernels {
namespace {

constexpr int64_t kWarpRowLimit = 1024;

// Forward: (m, s) = running max and sum of exp(x - m). Backward: s = sum of the per-element terms.
template <class C>
struct Stats {
  C m;
  C s;
};

template <class C>
__device__ __forceinline__ Stats<C> stats_identity(int op) {
  return {op <= kLogSoftmax ? -C(INFINITY) : C(0), C(0)};
}

template <class C>
__device__ __forceinline__ Stats<C> stats_combine(int op, const Stats<C>& a, const Stats<C>& b) {
  if (op > kLogSoftmax) return {C(0), a.s + b.s};
  if (isnan(a.m) || isnan(b.m)) return {C(NAN), C(0)};
  const C m = a.m > b.m ? a.m : b.m;
  if (isinf(m)) return {m, C(0)};
  return {m, a.s * m_exp(a.m - m) + b.s * m_exp(b.m - m)};
}

// The contribution of element (a, b): forward a = x; softmax_backward a = grad_y, b = y (term g*y);
// log_softmax_backward term g.
template <class C>
__device__ __forceinline__ Stats<C> stats_element(int op, C a, C b) {
  switch (op) {
    case kSoftmax:
    case kLogSoftmax: return {a, isinf(a) && a < 0 ? C(0) : C(1)};
    case kSoftmaxBackward: return {C(0), a * b};
    default: return {C(0), a};
  }
}

template <class C>
__device__ __forceinline__ C output(int op, C a, C b, const Stats<C>& st) {
  switch (op) {
    case kSoftmax:
      if (st.m == -C(INFINITY)) return C(0);  // fully masked row
      return m_exp(a - st.m) / st.s;
    case kLogSoftmax:
      if (st.m == -C(INFINITY)) return -C(INFINITY);
      return a - (st.m + m_log(st.s));
    case kSoftmaxBackward: return b * (a - st.s);
    default: return a - m_exp(b) * st.s;
  }
}

template <class C>
__device__ __forceinline__ Stats<C> warp_combine(int op, Stats<C> st) {
#pragma unroll
  for (int delta = 16; delta > 0; delta >>= 1) {
    const Stats<C> other{__shfl_xor_sync(0xffffffffu, st.m, delta), __shfl_xor_sync(0xffffffffu, st.s, delta)};
    st = stats_combine(op, st, other);
  }
  return st;
}

template <class T>
__device__ __forceinline__ compute_t<T> load_b(const T* b, int64_t i) {
  return b != nullptr ? widen(b[i]) : compute_t<T>(0);
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    warp_rows_kernel(int op, const T* a, const T* b, T* out, int64_t rows, int64_t size) {
  using C = compute_t<T>;
  const int lane = threadIdx.x & 31;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t nwarps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  for (int64_t row = warp; row < rows; row += nwarps) {
    const int64_t base = row * size;
    Stats<C> st = stats_identity<C>(op);
    for (int64_t j = lane; j < size; j += 32) {
      st = stats_combine(op, st, stats_element(op, widen(a[base + j]), load_b(b, base + j)));
    }
    st = warp_combine(op, st);  // xor shuffles: every lane ends with the row's stats
    for (int64_t j = lane; j < size; j += 32) {
      out[base + j] = narrow<T>(output(op, widen(a[base + j]), load_b(b, base + j), st));
    }
  }
}

// Forward rows of up to 32 * V * NC elements, a warp each, held in registers: one read, one exp and
// one write per element (the online (max, sum) pair of the generic kernel costs 3 exps per element,
// which made it compute-bound). Lane l holds the V-element vectors l, l + 32, ... (16-byte loads when
// V > 1). A NaN anywhere makes the row NaN; a fully masked row gives 0 / -inf.
template <class T, int V, int NC>
__global__ void __launch_bounds__(kThreads)
    warp_rows_forward_kernel(bool log, const T* a, T* out, int64_t rows, int64_t size) {
  using C = compute_t<T>;
  const int lane = threadIdx.x & 31;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t nwarps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  for (int64_t row = warp; row < rows; row += nwarps) {
    const T* ar = a + row * size;
    T* orow = out + row * size;
    C v[NC][V];
    C m = -C(INFINITY);
    bool nan = false;
#pragma unroll
    for (int k = 0; k < NC; ++k) {
      const int64_t e0 = static_cast<int64_t>(lane + k * 32) * V;
      if (e0 < size) {
        const Vec<T, V> x = *reinterpret_cast<const Vec<T, V>*>(ar + e0);
#pragma unroll
        for (int j = 0; j < V; ++j) v[k][j] = widen(x.v[j]);
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) v[k][j] = -C(INFINITY);
      }
#pragma unroll
      for (int j = 0; j < V; ++j) {
        nan |= isnan(v[k][j]);
        m = v[k][j] > m ? v[k][j] : m;
      }
    }
#pragma unroll
    for (int delta = 16; delta > 0; delta >>= 1) {
      const C o = __shfl_xor_sync(0xffffffffu, m, delta);
      m = o > m ? o : m;
    }
    if (__any_sync(0xffffffffu, nan)) m = C(NAN);
    const bool masked = m == -C(INFINITY);
    C s = C(0);
    if (!masked) {
#pragma unroll
      for (int k = 0; k < NC; ++k) {
#pragma unroll
        for (int j = 0; j < V; ++j) {
          // exp(-inf) = 0 for the padding. bf16 takes the hardware exp2 (__expf: a few f32 ulps, far
          // below bf16's step), which keeps the kernel memory-bound at half the bytes per element.
          C e;
          if constexpr (std::is_same_v<T, bf16>) {
            e = __expf(v[k][j] - m);
          } else {
            e = m_exp(v[k][j] - m);
          }
          s += e;
          if (!log) v[k][j] = e;
        }
      }
#pragma unroll
      for (int delta = 16; delta > 0; delta >>= 1) s += __shfl_xor_sync(0xffffffffu, s, delta);
    }
    const C scale = C(1) / s;      // softmax: e * (1 / s), as the CPU rounds it
    const C shift = m + m_log(s);  // log_softmax: x - lse
#pragma unroll
    for (int k = 0; k < NC; ++k) {
      const int64_t e0 = static_cast<int64_t>(lane + k * 32) * V;
      if (e0 < size) {
        Vec<T, V> y;
#pragma unroll
        for (int j = 0; j < V; ++j) {
          C r;
          if (masked) {
            r = log ? -C(INFINITY) : C(0);
          } else {
            r = log ? v[k][j] - shift : v[k][j] * scale;
          }
          y.v[j] = narrow<T>(r);
        }
        *reinterpret_cast<Vec<T, V>*>(orow + e0) = y;
      }
    }
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads) block_rows_kernel(int op, const T* a, const T* b, T* out, int64_t size) {
  using C = compute_t<T>;
  __shared__ Stats<C> partial[kThreads / 32];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * size;
  Stats<C> st = stats_identity<C>(op);
  for (int64_t j = threadIdx.x; j < size; j += blockDim.x) {
    st = stats_combine(op, st, stats_element(op, widen(a[base + j]), load_b(b, base + j)));
  }
  st = warp_combine(op, st);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) partial[warp] = st;
  __syncthreads();
  st = lane < kThreads / 32 ? partial[lane] : stats_identity<C>(op);
  st = warp_combine(op, st);
  for (int64_t j = threadIdx.x; j < size; j += blockDim.x) {
    out[base + j] = narrow<T>(output(op, widen(a[base + j]), load_b(b, base + j), st));
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    columns_kernel(int op, const T* a, const T* b, T* out, int64_t outer, int64_t size, int64_t inner) {
  using C = compute_t<T>;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nthreads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t col = tid; col < outer * inner; col += nthreads) {
    const int64_t base = (col / inner) * size * inner + col % inner;
    Stats<C> st = stats_identity<C>(op);
    for (int64_t d = 0; d < size; ++d) {
      const int64_t i = base + d * inner;
      st = stats_combine(op, st, stats_element(op, widen(a[i]), load_b(b, i)));
    }
    for (int64_t d = 0; d < size; ++d) {
      const int64_t i = base + d * inner;
      out[i] = narrow<T>(output(op, widen(a[i]), load_b(b, i), st));
    }
  }
}

int64_t capped_grid(int64_t blocks, int sm_count) {
  const int64_t cap = 32 * static_cast<int64_t>(sm_count);
  return blocks < 1 ? 1 : (blocks < cap ? blocks : cap);
}

}  // namespace

void launch_softmax(int op, int dtype, const void* a, const void* b, void* out, int64_t outer, int64_t size,
                    int64_t inner, int sm_count, cudaStream_t stream) {
  if (outer * size * inner == 0) return;
  visit_floating(dtype, [&]<class T>() {
    const T* pa = static_cast<const T*>(a);
    const T* pb = static_cast<const T*>(b);
    T* po = static_cast<T*>(out);
    if (inner == 1 && size <= kWarpRowLimit && (op == kSoftmax || op == kLogSoftmax)) {
      constexpr int W = vector_width(static_cast<int>(sizeof(T)));
      const bool vec =
          size % W == 0 && reinterpret_cast<uintptr_t>(a) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0;
      const int64_t grid = capped_grid((outer + kThreads / 32 - 1) / (kThreads / 32), sm_count);
      const auto go = [&]<int V>() {
        const int64_t per_lane = (size + 32 * V - 1) / (32 * V);  // vectors per lane
        const auto with = [&]<int NC>() {
          if constexpr (V * NC <= 32) {
            warp_rows_forward_kernel<T, V, NC>
                <<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(op == kLogSoftmax, pa, po, outer, size);
          }
        };
        if (per_lane <= 1) {
          with.template operator()<1>();
        } else if (per_lane <= 2) {
          with.template operator()<2>();
        } else if (per_lane <= 4) {
          with.template operator()<4>();
        } else if (per_lane <= 8) {
          with.template operator()<8>();
        } else if (per_lane <= 16) {
          with.template operator()<16>();
        } else {
          with.template operator()<32>();
        }
      };
      if (vec) {
        go.template operator()<W>();
      } else {
        go.template operator()<1>();
      }
      CPF_CUDA_CHECK_LAUNCH("softmax kernel (warp per row, registers)");
    } else if (inner == 1 && size <= kWarpRowLimit) {
      const int64_t grid = capped_grid((outer + kThreads / 32 - 1) / (kThreads / 32), sm_count);
      warp_rows_kernel<T><<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(op, pa, pb, po, outer, size);
      CPF_CUDA_CHECK_LAUNCH("softmax kernel (warp per row)");
    } else if (inner == 1) {
      block_rows_kernel<T><<<static_cast<unsigned>(outer), kThreads, 0, stream>>>(op, pa, pb, po, size);
      CPF_CUDA_CHECK_LAUNCH("softmax kernel (block per row)");
    } else {
      const int64_t grid = capped_grid((outer * inner + kThreads - 1) / kThreads, sm_count);
      columns_kernel<T><<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(op, pa, pb, po, outer, size, inner);
      CPF_CUDA_CHECK_LAUNCH("softmax kernel (columns)");
    }
  });
}

}  // namespace cpf::cuda::kernels
