// The fused classifier's row kernel (framework/tensor/ops/classifier_loss.h): the pass that turns a chunk
// of logits into its row losses and, in place, dlogits = (softmax - onehot) * scale.
//
// Row pass: a block per row. The first sweep folds online (max, sum of exp) pairs over 16-byte vectors
// and, when the row fits, keeps the row in shared memory; the second sweep writes dlogits from there
// (or re-reads the row from global memory/L2 when it does not fit). So a row is read from DRAM once
// and written once. Math in the compute type (f32 for bf16) with the CPU's formulas
// (classifier_loss.cpp); bf16 takes the hardware exp as the cross-entropy kernels do.
#include "framework/tensor/cuda/cuda_check.cuh"
#include "framework/tensor/cuda/row_kernels.cuh"
#include "framework/tensor/ops/classifier_row_kernel.h"

namespace cpf::cuda::kernels {

using namespace row_helpers;

namespace {

constexpr int kRowThreads = 512;

template <class T, class C>
__device__ __forceinline__ C cls_exp(C x) {
  if constexpr (std::is_same_v<T, bf16>) {
    return __expf(x);
  } else {
    return m_exp(x);
  }
}

// A row's log-sum-exp from one sweep of V-element vectors (cached in `cache` when kCache). NaN anywhere
// gives NaN; a fully masked row (all -inf) gives -inf, as on the CPU.
template <int V, bool kCache, class T, int THREADS = kRowThreads>
__device__ compute_t<T> row_lse(const T* xr, int64_t nvec, Vec<T, V>* cache, compute_t<T>* scratch) {
  using C = compute_t<T>;
  C m = -C(INFINITY), s = C(0);
  bool nan = false;
  // Unrolled so that several loads are in flight per thread (they do not depend on the running pair).
#pragma unroll 4
  for (int64_t q = threadIdx.x; q < nvec; q += THREADS) {
    const Vec<T, V> raw = reinterpret_cast<const Vec<T, V>*>(xr)[q];
    if constexpr (kCache) cache[q] = raw;
    C v[V];
    C lm = -C(INFINITY);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      v[k] = widen(raw.v[k]);
      nan |= isnan(v[k]);
      lm = v[k] > lm ? v[k] : lm;
    }
    if (lm > m) {
      s = m == -C(INFINITY) ? C(0) : s * cls_exp<T>(m - lm);
      m = lm;
    }
    if (m != -C(INFINITY)) {
#pragma unroll
      for (int k = 0; k < V; ++k) s += cls_exp<T>(v[k] - m);
    }
  }
  const C mx = group_reduce<THREADS, true>(m, scratch);
  nan = group_reduce<THREADS, false>(C(nan ? 1 : 0), scratch) > C(0);
  const C total = group_reduce<THREADS, false>(m == -C(INFINITY) ? C(0) : s * cls_exp<T>(m - mx), scratch);
  if (nan) return C(NAN);
  if (mx == -C(INFINITY)) return mx;
  return mx + m_log(total);
}

// The gradient scale: `value`, or 1 / *divisor read on the device (a CUDA graph replays it with each
// step's count).
struct RowScale {
  double value;
  const double* divisor;
};

// V: elements per vector (16 bytes, or 1 when the row length or base does not allow it). kCache: the
// row fits the dynamic shared memory.
template <int V, bool kCache, class T, class I, int THREADS = kRowThreads>
__global__ void __launch_bounds__(THREADS)
    classifier_rows_kernel(T* logits, const I* labels, double* row_loss, int64_t rows, int64_t cols, RowScale scale_s,
                           bool write_grad, int64_t ignore_index) {
  using C = compute_t<T>;
  extern __shared__ __align__(16) unsigned char dynamic_smem[];
  __shared__ C scratch[THREADS / 32];
  auto* cache = reinterpret_cast<Vec<T, V>*>(dynamic_smem);
  // 1 / divisor as the host computes it (IEEE division in f64), from device memory when given.
  const C scale = static_cast<C>(scale_s.divisor != nullptr ? __ddiv_rn(1.0, *scale_s.divisor) : scale_s.value);
  const int64_t nvec = cols / V;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    T* xr = logits + r * cols;
    const int64_t t = static_cast<int64_t>(labels[r]);
    if (t == ignore_index) {  // the whole block takes this branch
      if (threadIdx.x == 0) row_loss[r] = 0.0;
      if (write_grad) {
        Vec<T, V> zero;
#pragma unroll
        for (int k = 0; k < V; ++k) zero.v[k] = narrow<T>(C(0));
        for (int64_t q = threadIdx.x; q < nvec; q += THREADS) reinterpret_cast<Vec<T, V>*>(xr)[q] = zero;
      }
      continue;
    }
    const bool in_range = t >= 0 && t < cols;                        // else the index check reports it; the loss is NaN
    const C target = in_range ? widen(xr[in_range ? t : 0]) : C(0);  // read before any write
    const C l = row_lse<V, kCache, T, THREADS>(xr, nvec, cache, scratch);
    if (threadIdx.x == 0) {
      row_loss[r] =
          in_range ? static_cast<double>(l) - static_cast<double>(target) : __longlong_as_double(0x7ff8000000000000LL);
    }
    if (write_grad) {
      for (int64_t q = threadIdx.x; q < nvec; q += THREADS) {
        const Vec<T, V> raw = kCache ? cache[q] : reinterpret_cast<const Vec<T, V>*>(xr)[q];
        Vec<T, V> out;
#pragma unroll
        for (int k = 0; k < V; ++k) {
          C g = cls_exp<T>(widen(raw.v[k]) - l) * scale;  // softmax from the lse, as the CPU
          if (q * V + k == t) g -= scale;
          out.v[k] = narrow<T>(g);
        }
        reinterpret_cast<Vec<T, V>*>(xr)[q] = out;
      }
    }
    if constexpr (kCache) __syncthreads();  // the next row overwrites the cache
  }
}

template <int V, bool kCache, class T, class I, int THREADS = kRowThreads>
void launch_rows(T* logits, const I* labels, double* row_loss, int64_t rows, int64_t cols, RowScale scale,
                 bool write_grad, int64_t ignore_index, size_t smem, cudaStream_t stream) {
  auto kernel = classifier_rows_kernel<V, kCache, T, I, THREADS>;
  if (kCache) {
    CPF_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  }
  kernel<<<static_cast<unsigned>(capped(rows)), THREADS, kCache ? smem : 0, stream>>>(
      logits, labels, row_loss, rows, cols, scale, write_grad, ignore_index);
}

// The vectorised row pass (V-element vectors): the requested kernel where the row fits it, else auto.
template <int V, class T, class I>
void launch_vector_rows(T* x, const I* l, double* row_loss, int64_t rows, int64_t cols, RowScale scale, bool write_grad,
                        int64_t ignore_index, size_t smem, size_t max_smem, cudaStream_t stream) {
  using RowKernel = raw::ClassifierRowKernel;  // framework/tensor/ops/classifier_row_kernel.h
  RowKernel k = raw::classifier_row_kernel_from_env();
  if (k == RowKernel::automatic || (k == RowKernel::cached && smem > max_smem)) {
    k = smem <= max_smem ? RowKernel::cached : RowKernel::reread512;
  }
  switch (k) {
    case RowKernel::cached:
      return launch_rows<V, true>(x, l, row_loss, rows, cols, scale, write_grad, ignore_index, smem, stream);
    case RowKernel::reread256:
      return launch_rows<V, false, T, I, 256>(x, l, row_loss, rows, cols, scale, write_grad, ignore_index, 0, stream);
    case RowKernel::reread1024:
      return launch_rows<V, false, T, I, 1024>(x, l, row_loss, rows, cols, scale, write_grad, ignore_index, 0, stream);
    default: return launch_rows<V, false>(x, l, row_loss, rows, cols, scale, write_grad, ignore_index, 0, stream);
  }
}

}  // namespace

void launch_classifier_rows(int dtype, int it_dtype, void* logits, const void* labels, double* row_loss, int64_t rows,
                            int64_t cols, double scale_value, const double* divisor, bool write_grad,
                            int64_t ignore_index, cudaStream_t stream) {
  if (rows == 0) return;
  const RowScale scale{scale_value, divisor};
  int device = 0, optin = 0;
  CPF_CUDA_CHECK(cudaGetDevice(&device));
  CPF_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const size_t max_smem = static_cast<size_t>(optin) - 1024;  // room for the static reduction scratch
  visit_floating(dtype, [&]<class T>() {
    visit_index(it_dtype, [&]<class I>() {
      constexpr int W = vector_width(static_cast<int>(sizeof(T)));
      const bool vec = cols % W == 0 && reinterpret_cast<uintptr_t>(logits) % 16 == 0;
      const size_t smem = static_cast<size_t>(cols) * sizeof(T);
      const bool cache = smem <= max_smem;
      auto* x = static_cast<T*>(logits);
      auto* l = static_cast<const I*>(labels);
      if (vec) {
        launch_vector_rows<W>(x, l, row_loss, rows, cols, scale, write_grad, ignore_index, smem, max_smem, stream);
      } else if (cache) {
        launch_rows<1, true>(x, l, row_loss, rows, cols, scale, write_grad, ignore_index, smem, stream);
      } else {
        launch_rows<1, false>(x, l, row_loss, rows, cols, scale, write_grad, ignore_index, smem, stream);
      }
      CPF_CUDA_CHECK_LAUNCH("classifier rows kernel");
    });
  });
}

}  // namespace cpf::cuda::kernels
