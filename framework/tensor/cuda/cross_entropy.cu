// Cross-entropy row kernels: the forward (lse and f64 row losses; rows up to 1024 a warp with a max pass
// and a sum pass, longer rows a block in one pass of online (max, sum) pairs), the mean loss and count
// reduced on the device in a fixed order, and the backward (softmax recomputed from the saved lse; long
// rows a block per row with 16-byte vectors).
// Math is in the compute type (f32 for f32/bf16, f64 for f64) with the CPU's formulas
// (framework/tensor/ops/cross_entropy.cpp). Targets out of range are never read (the device-side index
// check reports them).
#include "framework/tensor/cuda/row_kernels.cuh"

namespace cpf::cuda::kernels {

using namespace row_helpers;

namespace {

// lse - logits[t] in f64; 0 for an ignored row. A target outside [0, cols) is never read: its row loss
// is NaN, and the index check (device_errors.cu) reports it at the next synchronisation.
template <class T, class C>
__device__ __forceinline__ double target_loss(C lse, const T* xr, int64_t t, int64_t cols, int64_t ignore_index) {
  if (t == ignore_index) return 0.0;
  if (t < 0 || t >= cols) return __longlong_as_double(0x7ff8000000000000LL);
  return static_cast<double>(lse) - static_cast<double>(ld(xr, t));
}

// exp for the cross-entropy sums: bf16 logits take the hardware exp2 (a few f32 ulps, far below bf16's
// step); f32 and f64 the accurate exp, as the CPU.
template <class T, class C>
__device__ __forceinline__ C ce_exp(C x) {
  if constexpr (std::is_same_v<T, bf16>) {
    return __expf(x);
  } else {
    return m_exp(x);
  }
}

// Rows longer than a warp's share (cols > 1024): a block per row, one pass. Each thread keeps an online
// (max m, sum of exp(x - m)) pair over its V-element vectors t, t + kThreads, ... (one exp per element,
// plus one per vector that raises the max); the pairs are then combined over the block. The generic
// kernel read the row twice (max, then sum) with scalar loads: 38% of the copy bandwidth on
// (2048, 32768) f32, whose rows do not stay in L2 between the passes.
template <int V, class T, class I>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_online_kernel(const T* logits, const I* targets, compute_t<T>* lse, double* row_loss, int64_t rows,
                                int64_t cols, int64_t ignore_index) {
  using C = compute_t<T>;
  __shared__ C scratch[kThreads / 32];
  const int64_t nvec = cols / V;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = logits + r * cols;
    C m = -C(INFINITY), s = C(0);
    bool nan = false;
    const auto fold = [&](const C(&v)[V]) {
      C lm = v[0];
#pragma unroll
      for (int j = 0; j < V; ++j) {
        nan |= isnan(v[j]);
        lm = v[j] > lm ? v[j] : lm;
      }
      if (lm > m) {
        s = m == -C(INFINITY) ? C(0) : s * ce_exp<T>(m - lm);
        m = lm;
      }
      if (m != -C(INFINITY)) {
#pragma unroll
        for (int j = 0; j < V; ++j) s += ce_exp<T>(v[j] - m);
      }
    };
    // Four vectors loaded before they are folded: the fold's dependency on (m, s) would otherwise leave
    // one load in flight per thread.
    int64_t q = threadIdx.x;
    for (; q + 3 * kThreads < nvec; q += 4 * kThreads) {
      C v0[V], v1[V], v2[V], v3[V];
      load_row_vec<T, V>(xr, q, v0);
      load_row_vec<T, V>(xr, q + kThreads, v1);
      load_row_vec<T, V>(xr, q + 2 * kThreads, v2);
      load_row_vec<T, V>(xr, q + 3 * kThreads, v3);
      fold(v0);
      fold(v1);
      fold(v2);
      fold(v3);
    }
    for (; q < nvec; q += kThreads) {
      C v[V];
      load_row_vec<T, V>(xr, q, v);
      fold(v);
    }
    for (int64_t j = nvec * V + threadIdx.x; j < cols; j += kThreads) {  // the tail (V == 1: the whole row)
      C v[V];
#pragma unroll
      for (int k = 0; k < V; ++k) v[k] = k == 0 ? ld(xr, j) : -C(INFINITY);
      fold(v);
    }
    const C mx = group_reduce<kThreads, true>(m, scratch);
    nan = group_reduce<kThreads, false>(C(nan ? 1 : 0), scratch) > C(0);
    const C scaled = m == -C(INFINITY) ? C(0) : s * ce_exp<T>(m - mx);
    const C total = group_reduce<kThreads, false>(scaled, scratch);
    C l;
    if (nan) {
      l = C(NAN);
    } else if (mx == -C(INFINITY)) {
      l = mx;  // fully masked row, as on the CPU
    } else {
      l = mx + m_log(total);
    }
    if (threadIdx.x == 0) {
      lse[r] = l;
      row_loss[r] = target_loss(l, xr, static_cast<int64_t>(targets[r]), cols, ignore_index);
    }
  }
}

// The mean loss over the rows whose target is not ignored: one block sums the f64 row losses and counts
// the rows in a fixed order (thread t takes rows t, t + kThreads, ...; then a tree over the threads),
// so the result does not depend on timing. loss (1) in the compute type, count (1) i64.
template <class C, class I>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_loss_kernel(const double* row_loss, const I* targets, int64_t rows, int64_t ignore_index, C* loss,
                              int64_t* count) {
  __shared__ double sums[kThreads];
  __shared__ long long counts[kThreads];
  double s = 0.0;
  long long n = 0;
  for (int64_t r = threadIdx.x; r < rows; r += kThreads) {
    s += row_loss[r];
    n += static_cast<int64_t>(targets[r]) != ignore_index ? 1 : 0;
  }
  sums[threadIdx.x] = s;
  counts[threadIdx.x] = n;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      sums[threadIdx.x] += sums[threadIdx.x + half];
      counts[threadIdx.x] += counts[threadIdx.x + half];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const long long valid = counts[0];
    loss[0] = static_cast<C>(valid > 0 ? sums[0] / static_cast<double>(valid) : 0.0);
    count[0] = valid;
  }
}

template <int G, class T, class I>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_kernel(const T* logits, const I* targets, compute_t<T>* lse, double* row_loss, int64_t rows,
                         int64_t cols, int64_t ignore_index) {
  using C = compute_t<T>;
  __shared__ C scratch[kThreads / 32];
  const RowLoop<G> loop;
  for (int64_t r = loop.first; r < rows; r += loop.step) {
    const T* xr = logits + r * cols;
    C m = -C(INFINITY);
    bool nan = false;
    for (int64_t j = loop.lane; j < cols; j += G) {
      const C v = ld(xr, j);
      nan |= isnan(v);
      m = v > m ? v : m;
    }
    m = group_reduce<G, true>(m, scratch);
    nan = group_reduce<G, false>(C(nan ? 1 : 0), scratch) > C(0);
    C l;
    if (nan) {
      l = C(NAN);
    } else if (m == -C(INFINITY)) {
      l = m;  // fully masked row, as on the CPU
    } else {
      C s = C(0);
      for (int64_t j = loop.lane; j < cols; j += G) s += m_exp(ld(xr, j) - m);
      l = m + m_log(group_reduce<G, false>(s, scratch));
    }
    if (loop.lane == 0) {
      lse[r] = l;
      const int64_t t = static_cast<int64_t>(targets[r]);
      row_loss[r] = target_loss(l, xr, t, cols, ignore_index);
    }
  }
}

template <class T, class I>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_backward_kernel(const T* logits, const I* targets, const compute_t<T>* lse, T* out, int64_t rows,
                                  int64_t cols, compute_t<T> scale, const double* grad_loss, const int64_t* count,
                                  int64_t ignore_index) {
  using C = compute_t<T>;
  // With the count on the device: grad_loss / count, rounded to the type as the CPU does.
  if (grad_loss != nullptr) scale = count[0] > 0 ? static_cast<C>(grad_loss[0] / static_cast<double>(count[0])) : C(0);
  const int64_t n = rows * cols;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t r = i / cols, j = i - r * cols;
    const int64_t t = static_cast<int64_t>(targets[r]);
    C v = C(0);
    if (t != ignore_index) {
      v = m_exp(ld(logits, i) - lse[r]) * scale;  // softmax from the saved lse, as on the CPU
      if (j == t) v -= scale;
    }
    out[i] = narrow<T>(v);
  }
}

// The backward of rows longer than a warp's share, with 16-byte vectors: a block per row, so the row's
// target and lse are read once and every load and store is a whole vector (the element-wise kernel
// above divides each flat index by cols and reads the target and lse per element). Same formula.
template <int V, class T, class I>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_backward_rows_kernel(const T* logits, const I* targets, const compute_t<T>* lse, T* out, int64_t rows,
                                       int64_t cols, compute_t<T> scale, const double* grad_loss, const int64_t* count,
                                       int64_t ignore_index) {
  using C = compute_t<T>;
  if (grad_loss != nullptr) scale = count[0] > 0 ? static_cast<C>(grad_loss[0] / static_cast<double>(count[0])) : C(0);
  const int64_t nvec = cols / V;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t t = static_cast<int64_t>(targets[r]);
    const bool ignored = t == ignore_index;
    const C l = lse[r];
    const auto* xr = reinterpret_cast<const Vec<T, V>*>(logits + r * cols);
    auto* orow = reinterpret_cast<Vec<T, V>*>(out + r * cols);
#pragma unroll 4
    for (int64_t q = threadIdx.x; q < nvec; q += kThreads) {
      const Vec<T, V> x = xr[q];
      Vec<T, V> o;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        C v = C(0);
        if (!ignored) {
          v = m_exp(widen(x.v[k]) - l) * scale;  // softmax from the saved lse, as on the CPU
          if (q * V + k == t) v -= scale;
        }
        o.v[k] = narrow<T>(v);
      }
      orow[q] = o;
    }
  }
}

}  // namespace

void launch_cross_entropy(int dtype, int it_dtype, const void* logits, const void* targets, void* lse, double* row_loss,
                          int64_t rows, int64_t cols, int64_t ignore_index, cudaStream_t stream) {
  if (rows == 0) return;
  visit_floating(dtype, [&]<class T>() {
    visit_index(it_dtype, [&]<class I>() {
      const auto args = [&](auto kernel) {
        kernel<<<static_cast<unsigned>(row_grid(rows, cols)), kThreads, 0, stream>>>(
            static_cast<const T*>(logits), static_cast<const I*>(targets), static_cast<compute_t<T>*>(lse), row_loss,
            rows, cols, ignore_index);
      };
      constexpr int W = vector_width(static_cast<int>(sizeof(T)));
      if (cols <= kWarpRowLimit) {
        args(cross_entropy_kernel<32, T, I>);
      } else if (cols % W == 0 && reinterpret_cast<uintptr_t>(logits) % 16 == 0) {
        args(cross_entropy_online_kernel<W, T, I>);
      } else {
        args(cross_entropy_online_kernel<1, T, I>);
      }
      CPF_CUDA_CHECK_LAUNCH("cross_entropy kernel");
    });
  });
}

void launch_cross_entropy_backward(int dtype, int it_dtype, const void* logits, const void* targets, const void* lse,
                                   void* out, int64_t rows, int64_t cols, double scale, const double* grad_loss,
                                   const int64_t* count, int64_t ignore_index, cudaStream_t stream) {
  if (rows * cols == 0) return;
  visit_floating(dtype, [&]<class T>() {
    visit_index(it_dtype, [&]<class I>() {
      constexpr int W = vector_width(static_cast<int>(sizeof(T)));
      const bool rows_kernel = cols > kWarpRowLimit && cols % W == 0 && reinterpret_cast<uintptr_t>(logits) % 16 == 0 &&
                               reinterpret_cast<uintptr_t>(out) % 16 == 0;
      if (rows_kernel) {
        cross_entropy_backward_rows_kernel<W, T, I><<<static_cast<unsigned>(capped(rows)), kThreads, 0, stream>>>(
            static_cast<const T*>(logits), static_cast<const I*>(targets), static_cast<const compute_t<T>*>(lse),
            static_cast<T*>(out), rows, cols, static_cast<compute_t<T>>(scale), grad_loss, count, ignore_index);
      } else {
        const int64_t blocks = capped((rows * cols + kThreads - 1) / kThreads);
        cross_entropy_backward_kernel<T, I><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
            static_cast<const T*>(logits), static_cast<const I*>(targets), static_cast<const compute_t<T>*>(lse),
            static_cast<T*>(out), rows, cols, static_cast<compute_t<T>>(scale), grad_loss, count, ignore_index);
      }
      CPF_CUDA_CHECK_LAUNCH("cross_entropy backward kernel");
    });
  });
}

void launch_cross_entropy_loss(int loss_dtype, int it_dtype, const double* row_loss, const void* targets, int64_t rows,
                               int64_t ignore_index, void* loss, int64_t* count, cudaStream_t stream) {
  visit_index(it_dtype, [&]<class I>() {
    if (loss_dtype == kF64) {
      cross_entropy_loss_kernel<double, I><<<1, kThreads, 0, stream>>>(row_loss, static_cast<const I*>(targets), rows,
                                                                       ignore_index, static_cast<double*>(loss), count);
    } else {
      cross_entropy_loss_kernel<float, I><<<1, kThreads, 0, stream>>>(row_loss, static_cast<const I*>(targets), rows,
                                                                      ignore_index, static_cast<float*>(loss), count);
    }
    CPF_CUDA_CHECK_LAUNCH("cross_entropy loss kernel");
  });
}

}  // namespace cpf::cuda::kernels
