// The residual add fused with LayerNorm / RMSNorm (framework/tensor/ops/add_norm.h), backward: the kernel
// reads dy, x1 and dx1 and writes dx = dx1 + norm'(dy) and db = dx in b's dtype. It also writes the
// parameter gradients' row-chunk partials in norm.cu's workspace layout when the row fits its registers
// (else norm.cu's partial kernel does); norm.cu's deterministic fold sums them. The forward is
// add_norm.cu. Math is in the compute type of x with the formulas of norm.cu and the CPU.
#include "framework/tensor/cuda/add_norm.cuh"

namespace cpf::cuda::kernels {

using namespace row_helpers;
using add_norm_detail::kCachedThreads;
using add_norm_detail::visit_narrow;

namespace {

// The rows a G-thread group walks. chunked: block b takes the rows [b * chunk, (b + 1) * chunk) (a warp
// group every blockDim / 32 rows of them), so its parameter partials are that chunk's; else grid-stride.
struct RowRange {
  int64_t first, end, step;
  int lane;
};
template <int G, bool chunked>
__device__ __forceinline__ RowRange row_range(int64_t rows, int64_t chunk) {
  if constexpr (chunked) {
    const int64_t begin = static_cast<int64_t>(blockIdx.x) * chunk;
    const int64_t end = begin + chunk < rows ? begin + chunk : rows;
    if constexpr (G == 32) {
      return {begin + (threadIdx.x >> 5), end, blockDim.x >> 5, static_cast<int>(threadIdx.x & 31)};
    }
    return {begin, end, 1, static_cast<int>(threadIdx.x)};
  }
  const RowLoop<G> loop;
  return {loop.first, rows, loop.step, loop.lane};
}

// Writes the block's parameter partials (sums over its chunk of g * xhat and g for the thread's vectors
// lane, lane + G, ...) to slot blockIdx.x of pw / pb (null: skipped; the layout of norm.cu's workspace).
// Warp groups are added in warp order through shared memory: deterministic.
template <int G, int V, int NC, class C>
__device__ void store_param_partials(const C (&aw)[NC][V], const C (&ab)[NC][V], C* pw, C* pb, int64_t cols, int lane) {
  const int64_t nvec = cols / V;
  pw = pw != nullptr ? pw + static_cast<int64_t>(blockIdx.x) * cols : nullptr;
  pb = pb != nullptr ? pb + static_cast<int64_t>(blockIdx.x) * cols : nullptr;
  if constexpr (G == 32) {
    __shared__ C fold[2][kWarpRowLimit];  // (2, cols): dw's and db's block sums
    const int warp = static_cast<int>(threadIdx.x >> 5), warps = static_cast<int>(blockDim.x >> 5);
    for (int w = 0; w < warps; ++w) {
      if (warp == w) {
#pragma unroll
        for (int k = 0; k < NC; ++k) {
          const int64_t q = lane + static_cast<int64_t>(k) * G;
          if (q >= nvec) continue;
#pragma unroll
          for (int j = 0; j < V; ++j) {
            fold[0][q * V + j] = w == 0 ? aw[k][j] : fold[0][q * V + j] + aw[k][j];
            fold[1][q * V + j] = w == 0 ? ab[k][j] : fold[1][q * V + j] + ab[k][j];
          }
        }
      }
      __syncthreads();
    }
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
      if (pw != nullptr) pw[i] = fold[0][i];
      if (pb != nullptr) pb[i] = fold[1][i];
    }
  } else {  // a block per row: each thread owns its columns
#pragma unroll
    for (int k = 0; k < NC; ++k) {
      const int64_t q = lane + static_cast<int64_t>(k) * G;
      if (q >= nvec) continue;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        if (pw != nullptr) pw[q * V + j] = aw[k][j];
        if (pb != nullptr) pb[q * V + j] = ab[k][j];
      }
    }
  }
}

// Pointers of the dx kernel: dx = dx1 (null: 0) + norm'(g), db = dx in TB (null: none); pw / pb (null: none)
// the parameter partials' slots, written when the kernel runs chunked.
template <class TX, class TG, class TB>
struct DxArgs {
  const TG* g;
  const TX* x1;
  const TX* w;
  const compute_t<TX>* mean;
  const compute_t<TX>* rstd;
  const TX* dx1;
  TX* dx;
  TB* db;
  compute_t<TX>* pw;
  compute_t<TX>* pb;
  int64_t rows, cols, chunk;
};

// dx's (and db's) vector q of row r: dx1 + rs * (gh - ma - xhat * mc); d1 holds dx1's vector q (when dx1
// is given), loaded by the caller so that the load can be issued before the row's reductions.
template <int V, class TX, class TG, class TB>
__device__ __forceinline__ void store_dx(const DxArgs<TX, TG, TB>& a, int64_t r, int64_t q, compute_t<TX> rs,
                                         compute_t<TX> ma, compute_t<TX> mc, const compute_t<TX> (&gh)[V],
                                         const compute_t<TX> (&xh)[V], const compute_t<TX> (&d1)[V]) {
  using C = compute_t<TX>;
  Vec<TX, V> o;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    C d = rs * (gh[k] - ma - xh[k] * mc);
    if (a.dx1 != nullptr) d = d1[k] + d;
    o.v[k] = narrow<TX>(d);
  }
  *reinterpret_cast<Vec<TX, V>*>(a.dx + r * a.cols + q * V) = o;
  if (a.db != nullptr) {
    Vec<TB, V> ob;
#pragma unroll
    for (int k = 0; k < V; ++k) ob.v[k] = narrow<TB>(static_cast<compute_t<TB>>(widen(o.v[k])));
    *reinterpret_cast<Vec<TB, V>*>(a.db + r * a.cols + q * V) = ob;
  }
}

// A warp's parameter partials in shared memory (dynamic: warps x (2, cols) in the compute type): the
// warp's sums of g * xhat (first cols) and of g, each lane owning its vectors' columns. In registers they
// took 2 NC V of them (48 at GPT-2's 768 f32 columns), which left no room to load dx1 ahead.
template <int V, int NC, class C>
__device__ __forceinline__ C* warp_partials(int64_t cols, int lane) {
  extern __shared__ __align__(16) unsigned char dx_partials_smem[];
  C* part = reinterpret_cast<C*>(dx_partials_smem) + static_cast<int64_t>(threadIdx.x >> 5) * 2 * cols;
  const int64_t nvec = cols / V;
#pragma unroll
  for (int k = 0; k < NC; ++k) {
    const int64_t q = lane + static_cast<int64_t>(k) * 32;
    if (q >= nvec) continue;
#pragma unroll
    for (int j = 0; j < V; ++j) part[q * V + j] = part[cols + q * V + j] = C(0);
  }
  return part;
}

// part[q V + j] += g xhat, part[cols + q V + j] += g for the lane's vector q (the register version's order).
template <int V, class C>
__device__ __forceinline__ void add_partials(C* part, int64_t cols, int64_t q, const C (&gc)[V], const C (&xh)[V]) {
  auto* sw = reinterpret_cast<Vec<C, V>*>(part + q * V);
  auto* sb = reinterpret_cast<Vec<C, V>*>(part + cols + q * V);
  Vec<C, V> w = *sw, b = *sb;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    w.v[j] += gc[j] * xh[j];
    b.v[j] += gc[j];
  }
  *sw = w;
  *sb = b;
}

// The register version of add_partials (a block per row: each thread owns its columns).
template <int V, class C>
__device__ __forceinline__ void add_partial_registers(C (&aw)[V], C (&ab)[V], const C (&gc)[V], const C (&xh)[V]) {
#pragma unroll
  for (int j = 0; j < V; ++j) {
    aw[j] += gc[j] * xh[j];
    ab[j] += gc[j];
  }
}

// The block's partials: its warps' sums added in warp order (as store_param_partials does), to slot
// blockIdx.x of pw / pb (null: skipped).
template <class C>
__device__ void fold_warp_partials(C* pw, C* pb, int64_t cols) {
  extern __shared__ __align__(16) unsigned char dx_partials_smem[];
  const C* part = reinterpret_cast<const C*>(dx_partials_smem);
  const int warps = static_cast<int>(blockDim.x >> 5);
  __syncthreads();  // every warp's sums are in
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
    C sw = part[i], sb = part[cols + i];
    for (int w = 1; w < warps; ++w) {
      sw = sw + part[w * 2 * cols + i];
      sb = sb + part[w * 2 * cols + cols + i];
    }
    if (pw != nullptr) pw[static_cast<int64_t>(blockIdx.x) * cols + i] = sw;
    if (pb != nullptr) pb[static_cast<int64_t>(blockIdx.x) * cols + i] = sb;
  }
}

// dx = dx1 + rstd * (gh - mean(gh) - xhat * mean(gh * xhat)), gh = g * w, xhat = (x1 - mean) * rstd
// (norm.cu's norm_dx_kernel plus the residual gradient); db = dx in b's dtype. G threads per row, V-element
// accesses (as add_norm_kernel); NC > 0: thread t keeps gh and xhat of its vectors t, t + G, ... (NC of
// them) in registers, so g, w and x1 are read once; NC = 0: the second pass reads them again.
// P (NC > 0 only): the kernel runs chunked and also sums g * xhat and g over its rows into registers, so
// the parameter gradients need no second pass over g and x1 (a separate partial kernel re-read 150 MB
// at GPT-2's (32768, 768) f32 x1 / bf16 g); the fold of the slots stays norm.cu's.
template <int G, int V, int NC, bool P, bool centered, class TX, class TG, class TB>
__global__ void __launch_bounds__(G == 32 ? kThreads : G) add_norm_dx_kernel(DxArgs<TX, TG, TB> a) {
  using C = compute_t<TX>;
  static_assert(!P || NC > 0, "parameter partials need the register-cached rows");
  constexpr bool kShared = P && G == 32;  // a warp's partials in shared memory (warp_partials)
  __shared__ C scratch[kThreads / 32];
  const RowRange rr = row_range<G, P>(a.rows, a.chunk);
  const int64_t cols = a.cols, nvec = cols / V;
  C aw[P && !kShared ? NC : 1][V] = {}, ab[P && !kShared ? NC : 1][V] = {};  // partials, block per row
  C* part = nullptr;
  if constexpr (kShared) part = warp_partials<V, NC, C>(cols, rr.lane);
  for (int64_t r = rr.first; r < rr.end; r += rr.step) {
    const TG* gr = a.g + r * cols;
    const TX* xr = a.x1 + r * cols;
    const TX* d1r = a.dx1 != nullptr ? a.dx1 + r * cols : nullptr;
    const C mu = centered ? a.mean[r] : C(0);
    const C rs = a.rstd[r];
    // gh, xhat and g of vector q.
    const auto fetch = [&](int64_t q, C(&gh)[V], C(&xh)[V], C(&gc)[V]) {
      compute_t<TG> gv[V];
      C wv[V], xv[V];
      load_row_vec<TG, V>(gr, q, gv);
      if (a.w != nullptr) load_row_vec<TX, V>(a.w, q, wv);
      load_row_vec<TX, V>(xr, q, xv);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        gc[k] = static_cast<C>(gv[k]);
        gh[k] = a.w != nullptr ? gc[k] * wv[k] : gc[k];
        xh[k] = (xv[k] - mu) * rs;
      }
    };
    // Cached rows: gh, xhat and dx1 of the thread's vectors, all loaded before the row's reductions.
    C cgh[NC > 0 ? NC : 1][V], cxh[NC > 0 ? NC : 1][V], cd1[NC > 0 ? NC : 1][V];
    if constexpr (NC > 0) {
#pragma unroll
      for (int k = 0; k < NC; ++k) {
        const int64_t q = rr.lane + static_cast<int64_t>(k) * G;
        if (q >= nvec) continue;
        C gc[V];
        fetch(q, cgh[k], cxh[k], gc);
        if (d1r != nullptr) load_row_vec<TX, V>(d1r, q, cd1[k]);
        if constexpr (kShared) add_partials<V>(part, cols, q, gc, cxh[k]);
        if constexpr (P && !kShared) add_partial_registers<V>(aw[k], ab[k], gc, cxh[k]);
      }
    }
    const auto each = [&](auto&& f) {  // f(q, gh, xhat, dx1 of vector q)
      if constexpr (NC > 0) {
#pragma unroll
        for (int k = 0; k < NC; ++k) {
          const int64_t q = rr.lane + static_cast<int64_t>(k) * G;
          if (q < nvec) f(q, cgh[k], cxh[k], cd1[k]);
        }
      } else {
        for (int64_t q = rr.lane; q < nvec; q += G) {
          C gh[V], xh[V], gc[V], d1[V];
          fetch(q, gh, xh, gc);
          if (d1r != nullptr) load_row_vec<TX, V>(d1r, q, d1);
          f(q, gh, xh, d1);
        }
      }
    };
    C sa = C(0), sc = C(0);
    each([&](int64_t, C(&gh)[V], C(&xh)[V], C(&)[V]) {
#pragma unroll
      for (int k = 0; k < V; ++k) {
        sa += gh[k];
        sc += gh[k] * xh[k];
      }
    });
    const C ma = centered ? group_reduce<G, false>(sa, scratch) / C(cols) : C(0);
    const C mc = group_reduce<G, false>(sc, scratch) / C(cols);
    each([&](int64_t q, C(&gh)[V], C(&xh)[V], C(&d1)[V]) { store_dx<V>(a, r, q, rs, ma, mc, gh, xh, d1); });
  }
  if constexpr (kShared) fold_warp_partials(a.pw, a.pb, cols);
  if constexpr (P && !kShared) store_param_partials<G, V, NC>(aw, ab, a.pw, a.pb, cols, rr.lane);
}

// Launches the dx kernel; true when it also wrote the parameter partials to `workspace` (dw or dbias wanted,
// rows that fit the register cache), so only the fold is left; false: the caller runs norm.cu's two passes.
template <bool centered, class TX, class TG, class TB>
bool backward_dx(const void* g, const void* x1, const void* w, const void* mean, const void* rstd, const void* dx1,
                 void* dx, void* db, bool params, void* workspace, int64_t rows, int64_t cols, cudaStream_t stream) {
  using C = compute_t<TX>;
  const int64_t chunk = norm_param_chunk_rows(rows), chunks = (rows + chunk - 1) / chunk;
  C* pw = static_cast<C*>(workspace);
  DxArgs<TX, TG, TB> args{static_cast<const TG*>(g),
                          static_cast<const TX*>(x1),
                          static_cast<const TX*>(w),
                          static_cast<const C*>(mean),
                          static_cast<const C*>(rstd),
                          static_cast<const TX*>(dx1),
                          static_cast<TX*>(dx),
                          static_cast<TB*>(db),
                          params ? pw : nullptr,
                          params ? pw + chunks * cols : nullptr,
                          rows,
                          cols,
                          chunk};
  const auto launch = [&]<int G, int V, int NC, bool P>(int64_t blocks) {
    auto kernel = add_norm_dx_kernel<G, V, NC, P, centered, TX, TG, TB>;
    // warp_partials: (2, cols) per warp; 48 KiB at 768 f32 columns, up to 128 KiB at 1024 f64 ones. The
    // opt-in for any dynamic size: 48 KiB plus the kernel's static shared memory is past the default limit.
    const int smem = P && G == 32 ? static_cast<int>(kThreads / 32 * 2 * cols * sizeof(C)) : 0;
    if (smem > 0) {
      CPF_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    }
    kernel<<<static_cast<unsigned>(blocks), G == 32 ? kThreads : G, smem, stream>>>(args);
  };
  constexpr int V = vector_width(static_cast<int>(sizeof(TX)));
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };  // null is aligned
  const bool vec =
      cols % V == 0 && aligned(g) && aligned(x1) && aligned(w) && aligned(dx1) && aligned(dx) && aligned(db);
  const bool warp = cols <= kWarpRowLimit;
  const int group = warp ? 32 : kCachedThreads;
  const int64_t per_thread = (cols / V + group - 1) / group;
  const int64_t blocks = warp ? row_grid(rows, cols) : capped(rows);
  // Two cached arrays (gh, xhat): up to 8 vectors a thread (6: GPT-2's 768 f32 columns), longer rows re-read.
  // With parameter partials, a block per chunk of rows.
  const bool fused = params && vec && per_thread <= 8;
  const auto cached = [&]<int GG, bool P>() {
    const int64_t n = P ? chunks : blocks;
    if (per_thread <= 2) return launch.template operator()<GG, V, 2, P>(n);
    if (per_thread <= 4) return launch.template operator()<GG, V, 4, P>(n);
    if (per_thread <= 6) return launch.template operator()<GG, V, 6, P>(n);
    if (per_thread <= 8) return launch.template operator()<GG, V, 8, P>(n);
    if constexpr (!P) launch.template operator()<GG, V, 0, false>(n);
  };
  if (vec) {
    if (fused) {
      warp ? cached.template operator()<32, true>() : cached.template operator()<kCachedThreads, true>();
    } else {
      warp ? cached.template operator()<32, false>() : cached.template operator()<kCachedThreads, false>();
    }
  } else if (warp) {
    launch.template operator()<32, 1, 0, false>(blocks);
  } else {
    launch.template operator()<kThreads, 1, 0, false>(capped(rows));
  }
  CPF_CUDA_CHECK_LAUNCH("add_norm backward kernel (dx)");
  return fused;
}

}  // namespace

void launch_add_norm_backward(bool centered, int x_dtype, int g_dtype, int db_dtype, const void* g, const void* x1,
                              const void* w, const void* mean, const void* rstd, const void* dx1, void* dx, void* db,
                              void* dw, void* dbias, int64_t rows, int64_t cols, void* workspace, cudaStream_t stream) {
  const bool params = dw != nullptr || dbias != nullptr;
  bool partials = false;  // the dx kernel wrote the parameter partials: only their fold is left
  visit_floating(x_dtype, [&]<class TX>() {
    visit_narrow<TX>(g_dtype, [&]<class TG>() {
      visit_narrow<TX>(db_dtype, [&]<class TB>() {
        if (rows == 0) return;
        const auto go = centered ? backward_dx<true, TX, TG, TB> : backward_dx<false, TX, TG, TB>;
        partials = go(g, x1, w, mean, rstd, dx1, dx, db, params, workspace, rows, cols, stream);
      });
    });
  });
  if (partials) return launch_norm_param_fold(x_dtype, workspace, dw, dbias, rows, cols, stream);
  launch_norm_param_grads(centered, g_dtype, x_dtype, g, x1, mean, rstd, dw, dbias, rows, cols, workspace, stream);
}

}  // namespace cpf::cuda::kernels
