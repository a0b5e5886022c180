// Row kernels of LayerNorm / RMSNorm, forward and backward. A row of up to 1024 elements gets a warp;
// longer rows that allow 16-byte accesses are held in registers by a block of 128 threads (one read);
// other rows a block of kThreads that re-reads the row for each pass (it stays in L1/L2). Math is in
// the compute type (f32 for f32/bf16, f64 for f64) with the same formulas as the CPU
// (framework/tensor/ops/norm.cpp). Parameter gradients are summed over fixed row chunks (sizes depend
// on the shape only) and the chunk partials then summed in order: deterministic, no atomics.
#include "framework/tensor/cuda/row_kernels.cuh"

namespace cpf::cuda::kernels {

using namespace row_helpers;

namespace {

template <int G, int V, bool centered, class T>
__global__ void __launch_bounds__(kThreads)
    norm_kernel(const T* x, const T* w, const T* b, T* y, compute_t<T>* mean, compute_t<T>* rstd, int64_t rows,
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
__global__ void __launch_bounds__(kCachedThreads)
    norm_cached_kernel(const T* x, const T* w, const T* b, T* y, compute_t<T>* mean, compute_t<T>* rstd, int64_t rows,
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
__global__ void __launch_bounds__(kThreads)
    norm_dx_kernel(const T* g, const T* x, const T* w, const compute_t<T>* mean, const compute_t<T>* rstd, T* dx,
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

// Pass 1: thread = column, blockIdx.y = row chunk; partial sums in row order. g may be narrower than x
// (a bf16 gradient of the fused add_norm's bf16 output, add_norm_backward.cu).
template <bool centered, class TG, class T>
__global__ void __launch_bounds__(kThreads)
    norm_param_partial_kernel(const TG* g, const T* x, const compute_t<T>* mean, const compute_t<T>* rstd,
                              compute_t<T>* pw, compute_t<T>* pb, int64_t rows, int64_t cols, int64_t chunk) {
  using C = compute_t<T>;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * chunk;
  const int64_t r1 = r0 + chunk < rows ? r0 + chunk : rows;
  C sw = C(0), sb = C(0);
  for (int64_t r = r0; r < r1; ++r) {
    const C gv = static_cast<C>(ld(g, r * cols + col));
    const C mu = centered ? mean[r] : C(0);
    sw += gv * (ld(x, r * cols + col) - mu) * rstd[r];
    sb += gv;
  }
  if (pw != nullptr) pw[blockIdx.y * cols + col] = sw;
  if (pb != nullptr) pb[blockIdx.y * cols + col] = sb;
}

// Pass 2: a block per 32 columns; warp w folds chunks w, w + 8, ... of its lane's column, then a fixed
// tree over the warps (deterministic). A thread per column walking every chunk in order was bound by
// load latency: 6% of a GPT-2 step for 768 columns.
constexpr int kSumCols = 32;
constexpr int kSumWarps = kThreads / 32;
template <class T>
__global__ void __launch_bounds__(kThreads)
    column_sum_kernel(const compute_t<T>* partial, T* out, int64_t chunks, int64_t cols) {
  using C = compute_t<T>;
  __shared__ C acc[kSumWarps][kSumCols];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kSumCols + lane;
  C s = C(0);
  if (col < cols) {
    for (int64_t k = warp; k < chunks; k += kSumWarps) s += partial[k * cols + col];
  }
  acc[warp][lane] = s;
  __syncthreads();
  if (warp != 0 || col >= cols) return;
  for (int w = 1; w < kSumWarps; ++w) s += acc[w][lane];
  out[col] = narrow<T>(s);
}

}  // namespace

void launch_norm(bool centered, int dtype, const void* x, const void* w, const void* b, void* y, void* mean, void* rstd,
                 int64_t rows, int64_t cols, double eps, cudaStream_t stream) {
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

// At most 256 chunks: pass 2 folds the chunks of a column, so more of them only lengthen it.
int64_t norm_param_chunk_rows(int64_t rows) {
  const int64_t c = (rows + 255) / 256;
  return c < 32 ? 32 : c;
}

size_t norm_backward_workspace_bytes(int dtype, int64_t rows, int64_t cols) {
  const int64_t chunks = (rows + norm_param_chunk_rows(rows) - 1) / norm_param_chunk_rows(rows);
  const size_t elem = dtype == kF64 ? 8 : 4;
  return 2 * static_cast<size_t>(chunks > 0 ? chunks : 1) * static_cast<size_t>(cols) * elem;
}

namespace {

// Pass 2 over the workspace's chunk partials (dw's, then db's; norm_backward_workspace_bytes) into dw / db.
template <class T>
void fold(const void* workspace, void* dw, void* db, int64_t rows, int64_t cols, cudaStream_t stream) {
  using C = compute_t<T>;
  const int64_t chunk = norm_param_chunk_rows(rows);
  const int64_t chunks = rows > 0 ? (rows + chunk - 1) / chunk : 0;
  const C* pw = static_cast<const C*>(workspace);
  const C* pb = pw + (chunks > 0 ? chunks : 1) * cols;
  const unsigned sum_blocks = static_cast<unsigned>((cols + kSumCols - 1) / kSumCols);
  if (dw != nullptr) column_sum_kernel<T><<<sum_blocks, kThreads, 0, stream>>>(pw, static_cast<T*>(dw), chunks, cols);
  if (db != nullptr) column_sum_kernel<T><<<sum_blocks, kThreads, 0, stream>>>(pb, static_cast<T*>(db), chunks, cols);
  CPF_CUDA_CHECK_LAUNCH("norm backward kernel (parameter sums)");
}

template <class TG, class T>
void param_grads(bool centered, const TG* pg, const T* px, const compute_t<T>* pm, const compute_t<T>* pr, void* dw,
                 void* db, int64_t rows, int64_t cols, void* workspace, cudaStream_t stream) {
  using C = compute_t<T>;
  const int64_t chunk = norm_param_chunk_rows(rows);
  const int64_t chunks = rows > 0 ? (rows + chunk - 1) / chunk : 0;
  C* pw = static_cast<C*>(workspace);
  C* pb = pw + (chunks > 0 ? chunks : 1) * cols;
  const unsigned col_blocks = static_cast<unsigned>((cols + kThreads - 1) / kThreads);
  if (chunks > 0) {
    const dim3 grid(col_blocks, static_cast<unsigned>(chunks));
    const auto kernel = centered ? norm_param_partial_kernel<true, TG, T> : norm_param_partial_kernel<false, TG, T>;
    kernel<<<grid, kThreads, 0, stream>>>(pg, px, pm, pr, dw ? pw : nullptr, db ? pb : nullptr, rows, cols, chunk);
    CPF_CUDA_CHECK_LAUNCH("norm backward kernel (parameter partials)");
  }
  fold<T>(workspace, dw, db, rows, cols, stream);
}

}  // namespace

void launch_norm_param_fold(int x_dtype, const void* workspace, void* dw, void* db, int64_t rows, int64_t cols,
                            cudaStream_t stream) {
  if (dw == nullptr && db == nullptr) return;
  visit_floating(x_dtype, [&]<class T>() { fold<T>(workspace, dw, db, rows, cols, stream); });
}

void launch_norm_param_grads(bool centered, int g_dtype, int x_dtype, const void* g, const void* x, const void* mean,
                             const void* rstd, void* dw, void* db, int64_t rows, int64_t cols, void* workspace,
                             cudaStream_t stream) {
  if (dw == nullptr && db == nullptr) return;
  visit_floating(x_dtype, [&]<class T>() {
    using C = compute_t<T>;
    const auto go = [&]<class TG>() {
      param_grads<TG, T>(centered, static_cast<const TG*>(g), static_cast<const T*>(x), static_cast<const C*>(mean),
                         static_cast<const C*>(rstd), dw, db, rows, cols, workspace, stream);
    };
    if constexpr (std::is_same_v<T, float>) {
      if (g_dtype == kBF16) return go.template operator()<bf16>();  // a bf16 gradient beside an f32 x
    }
    go.template operator()<T>();
  });
}

void launch_norm_backward(bool centered, int dtype, const void* g, const void* x, const void* w, const void* mean,
                          const void* rstd, void* dx, void* dw, void* db, int64_t rows, int64_t cols, void* workspace,
                          cudaStream_t stream) {
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
    if (dw != nullptr || db != nullptr)
      param_grads<T, T>(centered, pg, px, pm, pr, dw, db, rows, cols, workspace, stream);
  });
}

}  // namespace cpf::cuda::kernels
