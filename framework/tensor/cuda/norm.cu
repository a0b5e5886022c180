// Row kernels of the nn ops: LayerNorm / RMSNorm forward and backward, cross-entropy forward and
// backward. A row of up to 1024 elements gets a warp, a longer one a block of kThreads; the row is
// re-read from global memory for each pass (it stays in L1/L2). Math is in the compute type (f32 for
// f32/bf16, f64 for f64) with the same formulas as the CPU (framework/tensor/ops/norm.cpp,
// cross_entropy.cpp). Parameter gradients are summed over fixed row chunks (sizes depend on the shape
// only) and the chunk partials then summed in order: deterministic, no atomics.
#include "framework/tensor/cuda/elementwise.cuh"

namespace cpf::cuda::kernels {
namespace {

constexpr int64_t kWarpRowLimit = 1024;

__device__ __forceinline__ float m_exp(float x) { return expf(x); }
__device__ __forceinline__ double m_exp(double x) { return exp(x); }
__device__ __forceinline__ float m_log(float x) { return logf(x); }
__device__ __forceinline__ double m_log(double x) { return log(x); }
__device__ __forceinline__ float m_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double m_sqrt(double x) { return sqrt(x); }

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

// V elements per access (16-byte vectors when the row length and every base allow it): the row is read
// three times (mean, variance, output; the second and third from L1/L2), so fewer, wider loads matter.
template <class T, int V>
__device__ __forceinline__ void load_row_vec(const T* p, int64_t q, compute_t<T> (&out)[V]) {
  const Vec<T, V> v = *reinterpret_cast<const Vec<T, V>*>(p + q * V);
#pragma unroll
  for (int k = 0; k < V; ++k) out[k] = widen(v.v[k]);
}

template <int G, int V, bool centered, class T>
__global__ void __launch_bounds__(kThreads) norm_kernel(const T* x, const T* w, const T* b, T* y,
                                                        compute_t<T>* mean, compute_t<T>* rstd, int64_t rows,
                                                        int64_t cols, compute_t<T> eps) {
  using C = compute_t<T>;
  __shared__ C scratch[kThreads / 32];
  const RowLoop<G> loop;
  const int64_t nvec = cols / V;
  for (int64_t r = loop.first; r < rows; r += loop.step) {
    const T* xr = x + r * cols;
    C v[V];
    C mu = C(0);
    if constexpr (centered) {
      C s = C(0);
      for (int64_t q = loop.lane; q < nvec; q += G) {
        load_row_vec<T, V>(xr, q, v);
#pragma unroll
        for (int k = 0; k < V; ++k) s += v[k];
      }
      mu = group_reduce<G, false>(s, scratch) / C(cols);
    }
    C sq = C(0);
    for (int64_t q = loop.lane; q < nvec; q += G) {
      load_row_vec<T, V>(xr, q, v);
#pragma unroll
      for (int k = 0; k < V; ++k) sq += (v[k] - mu) * (v[k] - mu);
    }
    const C var = group_reduce<G, false>(sq, scratch) / C(cols);
    const C rs = C(1) / m_sqrt(var + eps);
    if (loop.lane == 0) {
      if constexpr (centered) mean[r] = mu;
      rstd[r] = rs;
    }
    T* yr = y + r * cols;
    for (int64_t q = loop.lane; q < nvec; q += G) {
      load_row_vec<T, V>(xr, q, v);
      C wv[V], bv[V];
      if (w != nullptr) load_row_vec<T, V>(w, q, wv);
      if (b != nullptr) load_row_vec<T, V>(b, q, bv);
      Vec<T, V> o;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        C t = (v[k] - mu) * rs;
        if (w != nullptr) t *= wv[k];
        if (b != nullptr) t += bv[k];
        o.v[k] = narrow<T>(t);
      }
      *reinterpret_cast<Vec<T, V>*>(yr + q * V) = o;
    }
  }
}

// Rows longer than a warp's share, a block each, held in registers: thread t keeps the V-element
// vectors t, t + kCachedThreads, ... (NC of them; 16-byte accesses), so x is read from memory once and the
// mean, the variance (the CPU's two-pass formula) and the output come from registers. Reading the row
// three times (the generic kernel) left bf16 at 55% of the copy bandwidth.
// Blocks of 128 threads with up to 8 vectors each (16 when V <= 4): more loads in flight per thread and
// cheaper block reductions than 256 threads with 2 (bf16 rows of 4096 reached 76% of the copy bandwidth
// that way).
constexpr int kCachedThreads = 128;
template <int V, int NC, bool centered, class T>
__global__ void __launch_bounds__(kCachedThreads) norm_cached_kernel(const T* x, const T* w, const T* b, T* y,
                                                               compute_t<T>* mean, compute_t<T>* rstd, int64_t rows,
                                                               int64_t cols, compute_t<T> eps) {
  using C = compute_t<T>;
  __shared__ C scratch[kCachedThreads / 32];
  const int64_t nvec = cols / V;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * cols;
    C v[NC][V];
#pragma unroll
    for (int k = 0; k < NC; ++k) {
      const int64_t q = threadIdx.x + static_cast<int64_t>(k) * kCachedThreads;
      if (q < nvec) {
        load_row_vec<T, V>(xr, q, v[k]);
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) v[k][j] = C(0);
      }
    }
    C mu = C(0);
    if constexpr (centered) {
      C s = C(0);
#pragma unroll
      for (int k = 0; k < NC; ++k) {
#pragma unroll
        for (int j = 0; j < V; ++j) s += v[k][j];
      }
      mu = group_reduce<kCachedThreads, false>(s, scratch) / C(cols);
    }
    C sq = C(0);
#pragma unroll
    for (int k = 0; k < NC; ++k) {
      if (threadIdx.x + static_cast<int64_t>(k) * kCachedThreads < nvec) {  // padding is not x - mu
#pragma unroll
        for (int j = 0; j < V; ++j) sq += (v[k][j] - mu) * (v[k][j] - mu);
      }
    }
    const C var = group_reduce<kCachedThreads, false>(sq, scratch) / C(cols);
    const C rs = C(1) / m_sqrt(var + eps);
    if (threadIdx.x == 0) {
      if constexpr (centered) mean[r] = mu;
      rstd[r] = rs;
    }
    T* yr = y + r * cols;
#pragma unroll
    for (int k = 0; k < NC; ++k) {
      const int64_t q = threadIdx.x + static_cast<int64_t>(k) * kCachedThreads;
      if (q >= nvec) continue;
      C wv[V], bv[V];
      if (w != nullptr) load_row_vec<T, V>(w, q, wv);
      if (b != nullptr) load_row_vec<T, V>(b, q, bv);
      Vec<T, V> o;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        C t = (v[k][j] - mu) * rs;
        if (w != nullptr) t *= wv[j];
        if (b != nullptr) t += bv[j];
        o.v[j] = narrow<T>(t);
      }
      *reinterpret_cast<Vec<T, V>*>(yr + q * V) = o;
    }
  }
}

// dx = rstd * (gh - mean(gh) - xhat * mean(gh * xhat)), gh = g * w, xhat = (x - mean) * rstd.
template <int G, bool centered, class T>
__global__ void __launch_bounds__(kThreads) norm_dx_kernel(const T* g, const T* x, const T* w,
                                                           const compute_t<T>* mean, const compute_t<T>* rstd, T* dx,
                                                           int64_t rows, int64_t cols) {
  using C = compute_t<T>;
  __shared__ C scratch[kThreads / 32];
  const RowLoop<G> loop;
  for (int64_t r = loop.first; r < rows; r += loop.step) {
    const T* gr = g + r * cols;
    const T* xr = x + r * cols;
    const C mu = centered ? mean[r] : C(0);
    const C rs = rstd[r];
    C sa = C(0), sc = C(0);
    for (int64_t j = loop.lane; j < cols; j += G) {
      const C gh = w != nullptr ? ld(gr, j) * ld(w, j) : ld(gr, j);
      sa += gh;
      sc += gh * ((ld(xr, j) - mu) * rs);
    }
    const C a = centered ? group_reduce<G, false>(sa, scratch) / C(cols) : C(0);
    const C c = group_reduce<G, false>(sc, scratch) / C(cols);
    for (int64_t j = loop.lane; j < cols; j += G) {
      const C gh = w != nullptr ? ld(gr, j) * ld(w, j) : ld(gr, j);
      const C xhat = (ld(xr, j) - mu) * rs;
      dx[r * cols + j] = narrow<T>(rs * (gh - a - xhat * c));
    }
  }
}

// Rows per chunk of the parameter-gradient partials: a function of the row count alone.
int64_t chunk_rows(int64_t rows) {
  const int64_t c = (rows + 1023) / 1024;
  return c < 32 ? 32 : c;
}

// Pass 1: thread = column, blockIdx.y = row chunk; partial sums in row order.
template <bool centered, class T>
__global__ void __launch_bounds__(kThreads) norm_param_partial_kernel(const T* g, const T* x,
                                                                      const compute_t<T>* mean,
                                                                      const compute_t<T>* rstd, compute_t<T>* pw,
                                                                      compute_t<T>* pb, int64_t rows, int64_t cols,
                                                                      int64_t chunk) {
  using C = compute_t<T>;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * chunk;
  const int64_t r1 = r0 + chunk < rows ? r0 + chunk : rows;
  C sw = C(0), sb = C(0);
  for (int64_t r = r0; r < r1; ++r) {
    const C gv = ld(g, r * cols + col);
    const C mu = centered ? mean[r] : C(0);
    sw += gv * (ld(x, r * cols + col) - mu) * rstd[r];
    sb += gv;
  }
  if (pw != nullptr) pw[blockIdx.y * cols + col] = sw;
  if (pb != nullptr) pb[blockIdx.y * cols + col] = sb;
}

// Pass 2: thread = column; chunk partials summed in order.
template <class T>
__global__ void __launch_bounds__(kThreads) column_sum_kernel(const compute_t<T>* partial, T* out, int64_t chunks,
                                                              int64_t cols) {
  using C = compute_t<T>;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  C s = C(0);
  for (int64_t k = 0; k < chunks; ++k) s += partial[k * cols + col];
  out[col] = narrow<T>(s);
}

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
__global__ void __launch_bounds__(kThreads) cross_entropy_online_kernel(const T* logits, const I* targets,
                                                                        compute_t<T>* lse, double* row_loss,
                                                                        int64_t rows, int64_t cols,
                                                                        int64_t ignore_index) {
  using C = compute_t<T>;
  __shared__ C scratch[kThreads / 32];
  const int64_t nvec = cols / V;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = logits + r * cols;
    C m = -C(INFINITY), s = C(0);
    bool nan = false;
    const auto fold = [&](const C (&v)[V]) {
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
__global__ void __launch_bounds__(kThreads) cross_entropy_loss_kernel(const double* row_loss, const I* targets,
                                                                      int64_t rows, int64_t ignore_index, C* loss,
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
__global__ void __launch_bounds__(kThreads) cross_entropy_kernel(const T* logits, const I* targets,
                                                                 compute_t<T>* lse, double* row_loss, int64_t rows,
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
__global__ void __launch_bounds__(kThreads) cross_entropy_backward_kernel(const T* logits, const I* targets,
                                                                          const compute_t<T>* lse, T* out,
                                                                          int64_t rows, int64_t cols,
                                                                          compute_t<T> scale, const double* grad_loss,
                                                                          const int64_t* count, int64_t ignore_index) {
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

int64_t capped(int64_t blocks) {
  constexpr int64_t cap = 65535 * 16;
  return blocks < 1 ? 1 : (blocks < cap ? blocks : cap);
}

int64_t row_grid(int64_t rows, int64_t cols) {
  return cols <= kWarpRowLimit ? capped((rows + kThreads / 32 - 1) / (kThreads / 32)) : capped(rows);
}

template <class Fn>
void visit_index(int dtype, Fn&& fn) {
  if (dtype == kI32) {
    fn.template operator()<int32_t>();
  } else {
    fn.template operator()<int64_t>();
  }
}

}  // namespace

void launch_norm(bool centered, int dtype, const void* x, const void* w, const void* b, void* y, void* mean,
                 void* rstd, int64_t rows, int64_t cols, double eps, cudaStream_t stream) {
  if (rows == 0) return;
  visit_floating(dtype, [&]<class T>() {
    using C = compute_t<T>;
    const auto args = [&](auto kernel) {
      kernel<<<static_cast<unsigned>(row_grid(rows, cols)), kThreads, 0, stream>>>(
          static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(b), static_cast<T*>(y),
          static_cast<C*>(mean), static_cast<C*>(rstd), rows, cols, static_cast<C>(eps));
    };
    constexpr int W = vector_width(static_cast<int>(sizeof(T)));
    const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    const bool vec = cols % W == 0 && aligned(x) && aligned(w) && aligned(b) && aligned(y);  // null is aligned
    // Longer vectorisable rows of up to kCachedThreads * W * 8 (16 for W <= 4) elements: the register-cached
    // kernel, a block of kCachedThreads per row.
    const int64_t per_thread = (cols / W + kCachedThreads - 1) / kCachedThreads;
    constexpr int64_t max_per_thread = W <= 4 ? 16 : 8;
    if (vec && cols > kWarpRowLimit && per_thread <= max_per_thread) {
      const auto cached = [&]<int NC>() {
        const auto kernel = centered ? norm_cached_kernel<W, NC, true, T> : norm_cached_kernel<W, NC, false, T>;
        kernel<<<static_cast<unsigned>(capped(rows)), kCachedThreads, 0, stream>>>(
            static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(b), static_cast<T*>(y),
            static_cast<C*>(mean), static_cast<C*>(rstd), rows, cols, static_cast<C>(eps));
      };
      if (per_thread <= 1) {
        cached.template operator()<1>();
      } else if (per_thread <= 2) {
        cached.template operator()<2>();
      } else if (per_thread <= 4) {
        cached.template operator()<4>();
      } else if (per_thread <= 8) {
        cached.template operator()<8>();
      } else if constexpr (W <= 4) {
        cached.template operator()<16>();
      }
      CPF_CUDA_CHECK_LAUNCH("norm kernel (row in registers)");
      return;
    }
    const auto go = [&]<int V>() {
      const bool warp = cols <= kWarpRowLimit;
      if (centered) {
        warp ? args(norm_kernel<32, V, true, T>) : args(norm_kernel<kThreads, V, true, T>);
      } else {
        warp ? args(norm_kernel<32, V, false, T>) : args(norm_kernel<kThreads, V, false, T>);
      }
    };
    if (vec) {
      go.template operator()<W>();
    } else {
      go.template operator()<1>();
    }
    CPF_CUDA_CHECK_LAUNCH("norm kernel");
  });
}

size_t norm_backward_workspace_bytes(int dtype, int64_t rows, int64_t cols) {
  const int64_t chunks = (rows + chunk_rows(rows) - 1) / chunk_rows(rows);
  const size_t elem = dtype == kF64 ? 8 : 4;
  return 2 * static_cast<size_t>(chunks > 0 ? chunks : 1) * static_cast<size_t>(cols) * elem;
}

void launch_norm_backward(bool centered, int dtype, const void* g, const void* x, const void* w, const void* mean,
                          const void* rstd, void* dx, void* dw, void* db, int64_t rows, int64_t cols,
                          void* workspace, cudaStream_t stream) {
  visit_floating(dtype, [&]<class T>() {
    using C = compute_t<T>;
    const T* pg = static_cast<const T*>(g);
    const T* px = static_cast<const T*>(x);
    const C* pm = static_cast<const C*>(mean);
    const C* pr = static_cast<const C*>(rstd);
    if (rows > 0) {
      const auto dx_args = [&](auto kernel) {
        kernel<<<static_cast<unsigned>(row_grid(rows, cols)), kThreads, 0, stream>>>(
            pg, px, static_cast<const T*>(w), pm, pr, static_cast<T*>(dx), rows, cols);
      };
      const bool warp = cols <= kWarpRowLimit;
      if (centered) {
        warp ? dx_args(norm_dx_kernel<32, true, T>) : dx_args(norm_dx_kernel<kThreads, true, T>);
      } else {
        warp ? dx_args(norm_dx_kernel<32, false, T>) : dx_args(norm_dx_kernel<kThreads, false, T>);
      }
      CPF_CUDA_CHECK_LAUNCH("norm backward kernel (dx)");
    }
    if (dw == nullptr && db == nullptr) return;
    const int64_t chunk = chunk_rows(rows);
    const int64_t chunks = rows > 0 ? (rows + chunk - 1) / chunk : 0;
    C* pw = static_cast<C*>(workspace);
    C* pb = pw + (chunks > 0 ? chunks : 1) * cols;
    const unsigned col_blocks = static_cast<unsigned>((cols + kThreads - 1) / kThreads);
    if (chunks > 0) {
      const dim3 grid(col_blocks, static_cast<unsigned>(chunks));
      if (centered) {
        norm_param_partial_kernel<true, T><<<grid, kThreads, 0, stream>>>(
            pg, px, pm, pr, dw ? pw : nullptr, db ? pb : nullptr, rows, cols, chunk);
      } else {
        norm_param_partial_kernel<false, T><<<grid, kThreads, 0, stream>>>(
            pg, px, pm, pr, dw ? pw : nullptr, db ? pb : nullptr, rows, cols, chunk);
      }
      CPF_CUDA_CHECK_LAUNCH("norm backward kernel (parameter partials)");
    }
    if (dw != nullptr) column_sum_kernel<T><<<col_blocks, kThreads, 0, stream>>>(pw, static_cast<T*>(dw), chunks, cols);
    if (db != nullptr) column_sum_kernel<T><<<col_blocks, kThreads, 0, stream>>>(pb, static_cast<T*>(db), chunks, cols);
    CPF_CUDA_CHECK_LAUNCH("norm backward kernel (parameter sums)");
  });
}

void launch_cross_entropy(int dtype, int it_dtype, const void* logits, const void* targets, void* lse,
                          double* row_loss, int64_t rows, int64_t cols, int64_t ignore_index, cudaStream_t stream) {
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
      const int64_t blocks = capped((rows * cols + kThreads - 1) / kThreads);
      cross_entropy_backward_kernel<T, I><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
          static_cast<const T*>(logits), static_cast<const I*>(targets), static_cast<const compute_t<T>*>(lse),
          static_cast<T*>(out), rows, cols, static_cast<compute_t<T>>(scale), grad_loss, count, ignore_index);
      CPF_CUDA_CHECK_LAUNCH("cross_entropy backward kernel");
    });
  });
}

void launch_cross_entropy_loss(int loss_dtype, int it_dtype, const double* row_loss, const void* targets,
                               int64_t rows, int64_t ignore_index, void* loss, int64_t* count, cudaStream_t stream) {
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
