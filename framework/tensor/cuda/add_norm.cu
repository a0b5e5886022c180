// The residual add fused with LayerNorm / RMSNorm (framework/tensor/ops/add_norm.h), forward: one kernel
// reads the f32 stream x and the sub-block's output b (bf16 or x's dtype), writes x1 = x + b and
// y = norm(x1) in the compute dtype. Unfused, the same step was a cast of b, an f32 add, the norm and a
// cast of y (four passes over the rows). The backward is add_norm_backward.cu. Math is in the compute
// type of x with the formulas of norm.cu and the CPU.
#include "framework/tensor/cuda/add_norm.cuh"

namespace cpf::cuda::kernels {

using namespace row_helpers;
using add_norm_detail::kCachedThreads;
using add_norm_detail::visit_narrow;

namespace {

// At most this many rows (a decoding step's batch) get a block per row even when a warp would hold the row:
// one warp walking 768 columns is a latency chain of 6 loads and 3 reductions that 127 idle SMs wait on.
constexpr int64_t kFewRows = 32;

// y's vector q = ((x1 - mean) * rstd) * w + bias (w, bias null: skipped), from x1's values v.
template <int V, class TX, class TY>
__device__ __forceinline__ void store_normed(const compute_t<TX> (&v)[V], const TX* w, const TX* bias, compute_t<TX> mu,
                                             compute_t<TX> rs, int64_t q, TY* yr) {
  using C = compute_t<TX>;
  C wv[V], bv[V];
  if (w != nullptr) load_row_vec<TX, V>(w, q, wv);
  if (bias != nullptr) load_row_vec<TX, V>(bias, q, bv);
  Vec<TY, V> o;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    C t = (v[k] - mu) * rs;
    if (w != nullptr) t *= wv[k];
    if (bias != nullptr) t += bv[k];
    o.v[k] = narrow<TY>(static_cast<compute_t<TY>>(t));
  }
  *reinterpret_cast<Vec<TY, V>*>(yr + q * V) = o;
}

// G threads per row (32: a warp, else the block); V-element accesses. NC > 0: thread t keeps vectors t,
// t + G, ... (NC of them) of x1 in registers, so x and b are read once; NC = 0: every pass recomputes x1
// from x and b (rows too long for registers), which gives the same values.
template <int G, int V, int NC, bool centered, class TX, class TB, class TY>
__global__ void __launch_bounds__(G == 32 ? kThreads : G)
    add_norm_kernel(const TX* x, const TB* b, const TX* w, const TX* bias, TX* x1, TY* y, compute_t<TX>* mean,
                    compute_t<TX>* rstd, int64_t rows, int64_t cols, compute_t<TX> eps) {
  using C = compute_t<TX>;
  __shared__ C scratch[kThreads / 32];
  const RowLoop<G> loop;
  const int64_t nvec = cols / V;
  for (int64_t r = loop.first; r < rows; r += loop.step) {
    const TX* xr = x + r * cols;
    const TB* br = b != nullptr ? b + r * cols : nullptr;
    // x1's vector q, rounded to x's dtype (the values the CPU normalises).
    const auto fetch = [&](int64_t q, C(&v)[V]) {
      load_row_vec<TX, V>(xr, q, v);
      if (b != nullptr) {
        C bv[V];
        load_row_vec<TB, V>(br, q, bv);
#pragma unroll
        for (int k = 0; k < V; ++k) v[k] = widen(narrow<TX>(v[k] + static_cast<C>(bv[k])));
      }
    };
    C cache[NC > 0 ? NC : 1][V];
    if constexpr (NC > 0) {
#pragma unroll
      for (int k = 0; k < NC; ++k) {
        const int64_t q = loop.lane + static_cast<int64_t>(k) * G;
        if (q < nvec) fetch(q, cache[k]);
      }
    }
    const auto each = [&](auto&& f) {  // f(q, x1 values of vector q)
      if constexpr (NC > 0) {
#pragma unroll
        for (int k = 0; k < NC; ++k) {
          const int64_t q = loop.lane + static_cast<int64_t>(k) * G;
          if (q < nvec) f(q, cache[k]);
        }
      } else {
        for (int64_t q = loop.lane; q < nvec; q += G) {
          C v[V];
          fetch(q, v);
          f(q, v);
        }
      }
    };
    C s = C(0);
    each([&](int64_t q, C(&v)[V]) {
      if (b != nullptr) {
        Vec<TX, V> o;
#pragma unroll
        for (int k = 0; k < V; ++k) o.v[k] = narrow<TX>(v[k]);
        *reinterpret_cast<Vec<TX, V>*>(x1 + r * cols + q * V) = o;
      }
#pragma unroll
      for (int k = 0; k < V; ++k) s += v[k];
    });
    const C mu = centered ? group_reduce<G, false>(s, scratch) / C(cols) : C(0);
    C sq = C(0);
    each([&](int64_t, C(&v)[V]) {
#pragma unroll
      for (int k = 0; k < V; ++k) sq += (v[k] - mu) * (v[k] - mu);
    });
    const C rs = C(1) / m_sqrt(group_reduce<G, false>(sq, scratch) / C(cols) + eps);
    if (loop.lane == 0) {
      if constexpr (centered) mean[r] = mu;
      rstd[r] = rs;
    }
    each([&](int64_t q, C(&v)[V]) { store_normed<V>(v, w, bias, mu, rs, q, y + r * cols); });
  }
}

template <bool centered, class TX, class TB, class TY>
void forward(const void* x, const void* b, const void* w, const void* bias, void* x1, void* y, void* mean, void* rstd,
             int64_t rows, int64_t cols, double eps, cudaStream_t stream) {
  using C = compute_t<TX>;
  const auto launch = [&]<int G, int V, int NC>(int64_t blocks) {
    add_norm_kernel<G, V, NC, centered, TX, TB, TY>
        <<<static_cast<unsigned>(blocks), G == 32 ? kThreads : G, 0, stream>>>(
            static_cast<const TX*>(x), static_cast<const TB*>(b), static_cast<const TX*>(w),
            static_cast<const TX*>(bias), static_cast<TX*>(x1), static_cast<TY*>(y), static_cast<C*>(mean),
            static_cast<C*>(rstd), rows, cols, static_cast<C>(eps));
  };
  constexpr int V = vector_width(static_cast<int>(sizeof(TX)));
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };  // null is aligned
  const bool vec =
      cols % V == 0 && aligned(x) && aligned(b) && aligned(w) && aligned(bias) && aligned(x1) && aligned(y);
  const bool warp = cols <= kWarpRowLimit && rows > kFewRows;
  const int group = warp ? 32 : kCachedThreads;
  const int64_t per_thread = (cols / V + group - 1) / group;
  const int64_t blocks = warp ? row_grid(rows, cols) : capped(rows);
  const auto cached = [&]<int GG>() {
    if (per_thread <= 2) return launch.template operator()<GG, V, 2>(blocks);
    if (per_thread <= 4) return launch.template operator()<GG, V, 4>(blocks);
    if (per_thread <= 8) return launch.template operator()<GG, V, 8>(blocks);
    launch.template operator()<GG, V, 16>(blocks);
  };
  if (vec && per_thread <= 16) {
    warp ? cached.template operator()<32>() : cached.template operator()<kCachedThreads>();
  } else if (warp) {
    launch.template operator()<32, 1, 0>(blocks);
  } else {
    launch.template operator()<kThreads, 1, 0>(capped(rows));
  }
  CPF_CUDA_CHECK_LAUNCH("add_norm kernel");
}

}  // namespace

void launch_add_norm(bool centered, int x_dtype, int b_dtype, int y_dtype, const void* x, const void* b, const void* w,
                     const void* bias, void* x1, void* y, void* mean, void* rstd, int64_t rows, int64_t cols,
                     double eps, cudaStream_t stream) {
  if (rows == 0) return;
  visit_floating(x_dtype, [&]<class TX>() {
    visit_narrow<TX>(b_dtype, [&]<class TB>() {
      visit_narrow<TX>(y_dtype, [&]<class TY>() {
        const auto go = centered ? forward<true, TX, TB, TY> : forward<false, TX, TB, TY>;
        go(x, b, w, bias, x1, y, mean, rstd, rows, cols, eps, stream);
      });
    });
  });
}

}  // namespace cpf::cuda::kernels
