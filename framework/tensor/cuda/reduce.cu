// Row reductions of a contiguous (K, R) matrix (sum, mean, amax, logsumexp, argmax) and column
// reductions of a contiguous (R, K) matrix (sum, mean, amax); op codes are kernels.cuh's ReduceCode
// (DeviceReduceOp's values).
// Rows: short rows get one warp each; long rows one block each, split into
// chunks across several blocks (partials combined by a second kernel) when there are too few rows
// to fill the GPU. Accumulation is in f32 for f32/bf16 and f64 for f64, as on the CPU.
#include <cfloat>

#include "framework/tensor/cuda/device_math.cuh"
#include "framework/tensor/cuda/elementwise.cuh"

namespace cpf::cuda::kernels {
namespace {

constexpr int64_t kWarpRowLimit = 1024;  // rows up to this length get a warp, longer ones a block
constexpr int64_t kMinChunk = 4096;      // columns per block at least, when a row is split

// Columns per chunk when a row is split in `chunks`: a multiple of 8 (16 bytes of bf16), so each chunk of
// an aligned row starts aligned for the vector loads.
__host__ __device__ __forceinline__ int64_t chunk_len(int64_t cols, int64_t chunks) {
  const int64_t len = (cols + chunks - 1) / chunks;
  return (len + 7) / 8 * 8;
}

// v: sum / max / running max (logsumexp) / best value (argmax); s: logsumexp's scaled sum;
// idx: argmax's index (-1 = no element yet).
template <class C>
struct Acc {
  C v;
  C s;
  int64_t idx;
};

template <class C>
__device__ __forceinline__ C neg_inf() {
  return -C(INFINITY);
}

template <class C>
__device__ __forceinline__ Acc<C> identity(int op) {
  if (op == kSum || op == kMean) return {C(0), C(0), -1};
  return {neg_inf<C>(), C(0), -1};
}

template <class C>
__device__ __forceinline__ Acc<C> element(int op, C x, int64_t j) {
  if (op == kLogsumexp) return {x, C(1), j};
  return {x, C(0), j};
}

// NaN is the greatest value; ties go to the lower index.
template <class C>
__device__ __forceinline__ bool better(const Acc<C>& a, const Acc<C>& b) {
  if (b.idx < 0) return true;
  if (a.idx < 0) return false;
  const bool an = isnan(a.v), bn = isnan(b.v);
  if (an != bn) return an;
  if (!an && a.v != b.v) return a.v > b.v;
  return a.idx < b.idx;
}

template <class C>
__device__ __forceinline__ Acc<C> combine(int op, const Acc<C>& a, const Acc<C>& b) {
  switch (op) {
    case kSum:
    case kMean: return {a.v + b.v, C(0), -1};
    case kAmax: return {(a.v > b.v || isnan(a.v)) ? a.v : b.v, C(0), -1};
    case kLogsumexp: {
      if (isnan(a.v) || isnan(b.v)) return {C(NAN), C(0), -1};
      const C m = a.v > b.v ? a.v : b.v;
      if (isinf(m)) return {m, C(0), -1};  // all -inf so far, or a +inf that decides the result
      return {m, a.s * m_exp(a.v - m) + b.s * m_exp(b.v - m), -1};
    }
    default: return better(a, b) ? a : b;
  }
}

template <class C>
__device__ __forceinline__ Acc<C> shfl_down(const Acc<C>& a, int delta) {
  return {__shfl_down_sync(0xffffffffu, a.v, delta), __shfl_down_sync(0xffffffffu, a.s, delta),
          static_cast<int64_t>(__shfl_down_sync(0xffffffffu, static_cast<long long>(a.idx), delta))};
}

template <class C>
__device__ __forceinline__ Acc<C> warp_reduce(int op, Acc<C> a) {
#pragma unroll
  for (int delta = 16; delta > 0; delta >>= 1) a = combine(op, a, shfl_down(a, delta));
  return a;
}

// Folds p[j] for j = first, first + step, ... < end into a, four independent loads in flight at a time.
template <class T>
__device__ __forceinline__ Acc<compute_t<T>> accumulate_range(int op, Acc<compute_t<T>> a, const T* p, int64_t first,
                                                              int64_t end, int64_t step) {
  int64_t j = first;
  for (; j + 3 * step < end; j += 4 * step) {
    const T x0 = p[j], x1 = p[j + step], x2 = p[j + 2 * step], x3 = p[j + 3 * step];
    a = combine(op, a, element(op, widen(x0), j));
    a = combine(op, a, element(op, widen(x1), j + step));
    a = combine(op, a, element(op, widen(x2), j + 2 * step));
    a = combine(op, a, element(op, widen(x3), j + 3 * step));
  }
  for (; j < end; j += step) a = combine(op, a, element(op, widen(p[j]), j));
  return a;
}

// Folds p[first..end) with 16-byte vector loads: thread t takes vectors t, t + step, ... of the range,
// two vectors in flight; p + first is 16-byte aligned (checked by the host). The scalar tail after the
// last whole vector is folded by the same threads.
template <class T>
__device__ __forceinline__ Acc<compute_t<T>> accumulate_vec(int op, Acc<compute_t<T>> a, const T* p, int64_t first,
                                                            int64_t end, int tid, int step) {
  constexpr int V = vector_width(static_cast<int>(sizeof(T)));
  const int64_t nv = (end - first) / V;
  const Vec<T, V>* pv = reinterpret_cast<const Vec<T, V>*>(p + first);
  int64_t q = tid;
  for (; q + step < nv; q += 2 * static_cast<int64_t>(step)) {
    const Vec<T, V> x0 = pv[q], x1 = pv[q + step];
#pragma unroll
    for (int k = 0; k < V; ++k) a = combine(op, a, element(op, widen(x0.v[k]), first + q * V + k));
#pragma unroll
    for (int k = 0; k < V; ++k) a = combine(op, a, element(op, widen(x1.v[k]), first + (q + step) * V + k));
  }
  if (q < nv) {
    const Vec<T, V> x0 = pv[q];
#pragma unroll
    for (int k = 0; k < V; ++k) a = combine(op, a, element(op, widen(x0.v[k]), first + q * V + k));
  }
  return accumulate_range<T>(op, a, p, first + nv * V + tid, end, step);
}

// Lane/thread 0 of the warp/block has the whole row's accumulator: write the result.
template <class T>
__device__ __forceinline__ void write_result(int op, const Acc<compute_t<T>>& a, int64_t cols, void* out, int64_t row) {
  using C = compute_t<T>;
  if (op == kArgmax) {
    static_cast<int64_t*>(out)[row] = a.idx < 0 ? 0 : a.idx;
    return;
  }
  C r = a.v;
  if (op == kMean) r = a.v / static_cast<C>(cols);
  if (op == kLogsumexp && !isnan(a.v) && !isinf(a.v)) r = a.v + m_log(a.s);
  static_cast<T*>(out)[row] = narrow<T>(r);
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    warp_rows_kernel(int op, const T* in, void* out, int64_t rows, int64_t cols) {
  using C = compute_t<T>;
  const int lane = threadIdx.x & 31;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t nwarps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  for (int64_t row = warp; row < rows; row += nwarps) {
    const T* p = in + row * cols;
    Acc<C> a = identity<C>(op);
    a = accumulate_range<T>(op, a, p, lane, cols, 32);
    a = warp_reduce(op, a);
    if (lane == 0) write_result<T>(op, a, cols, out, row);
  }
}

// Block b reduces chunk (b % chunks) of row (b / chunks); with one chunk it writes the result,
// otherwise its partial accumulator.
template <class T>
__global__ void __launch_bounds__(kThreads)
    block_rows_kernel(int op, const T* in, void* out, Acc<compute_t<T>>* partial, int64_t rows, int64_t cols,
                      int64_t chunks, bool vec) {
  using C = compute_t<T>;
  __shared__ Acc<C> warp_acc[kThreads / 32];
  const int64_t row = blockIdx.x / chunks;
  const int64_t chunk = blockIdx.x % chunks;
  const int64_t len = chunk_len(cols, chunks);
  const int64_t begin = chunk * len;
  const int64_t end = begin + len < cols ? begin + len : cols;
  const T* p = in + row * cols;
  Acc<C> a = identity<C>(op);
  if (vec) {
    a = accumulate_vec<T>(op, a, p, begin, end, threadIdx.x, blockDim.x);
  } else {
    a = accumulate_range<T>(op, a, p, begin + threadIdx.x, end, blockDim.x);
  }
  a = warp_reduce(op, a);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) warp_acc[warp] = a;
  __syncthreads();
  if (warp == 0) {
    a = lane < kThreads / 32 ? warp_acc[lane] : identity<C>(op);
    a = warp_reduce(op, a);
    if (lane == 0) {
      if (chunks == 1) {
        write_result<T>(op, a, cols, out, row);
      } else {
        partial[blockIdx.x] = a;
      }
    }
  }
}

// A block per row folds the row's chunk partials: thread t takes chunks t, t + kThreads, ... in order,
// then the block combines in a fixed tree (deterministic). One warp per row left the single-row sum
// waiting on ~1000 dependent partial loads after the main kernel.
template <class T>
__global__ void __launch_bounds__(kThreads) combine_partials_kernel(int op, const Acc<compute_t<T>>* partial, void* out,
                                                                    int64_t rows, int64_t cols, int64_t chunks) {
  using C = compute_t<T>;
  __shared__ Acc<C> warp_acc[kThreads / 32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    Acc<C> a = identity<C>(op);
    for (int64_t c = threadIdx.x; c < chunks; c += kThreads) a = combine(op, a, partial[row * chunks + c]);
    a = warp_reduce(op, a);
    __syncthreads();  // warp_acc may still be read for the previous row
    if (lane == 0) warp_acc[warp] = a;
    __syncthreads();
    if (warp == 0) {
      a = lane < kThreads / 32 ? warp_acc[lane] : identity<C>(op);
      a = warp_reduce(op, a);
      if (lane == 0) write_result<T>(op, a, cols, out, row);
    }
  }
}

int64_t chunks_for(int64_t rows, int64_t cols, int sm_count) {
  if (cols <= kWarpRowLimit) return 0;  // warp per row
  // Enough blocks of kThreads to fill every SM (2048 threads each on sm_80+): with half of that the
  // full sum of 2^26 f32 reached 69% of the copy bandwidth.
  const int64_t want_blocks = 8 * static_cast<int64_t>(sm_count);
  if (rows >= want_blocks) return 1;
  const int64_t by_blocks = (want_blocks + rows - 1) / rows;
  const int64_t by_size = (cols + kMinChunk - 1) / kMinChunk;
  const int64_t chunks = by_blocks < by_size ? by_blocks : by_size;
  // Rounding the chunk length up to a multiple of 8 can leave trailing chunks empty: drop them.
  return (cols + chunk_len(cols, chunks) - 1) / chunk_len(cols, chunks);
}

int64_t grid_for_warps(int64_t rows, int sm_count) {
  const int64_t warps_per_block = kThreads / 32;
  const int64_t need = (rows + warps_per_block - 1) / warps_per_block;
  const int64_t cap = 32 * static_cast<int64_t>(sm_count);
  return need < cap ? (need > 0 ? need : 1) : cap;
}

size_t acc_size(int dtype) { return dtype == kF64 ? sizeof(Acc<double>) : sizeof(Acc<float>); }

// ---- Column reductions: a contiguous (R, K) matrix folded over R (sum, mean, amax) ----
// What a bias gradient needs: dbias = dY.sum(0) for dY (tokens, features). Folding the rows in place
// replaces a transposing copy of the whole f32 gradient (plus a bf16 -> f32 cast of it), which took a
// third of a GPT-2 step's GPU time. Block (32, 8): a warp reads 32 consecutive columns of one row
// (coalesced), the 8 warps take every 8th row of the block's row chunk, and a fixed tree over them
// gives the chunk's partial. Chunks combine in order in a second kernel: deterministic.

constexpr int kColTile = 32;  // columns per block (one per lane)
constexpr int kColWarps = 8;  // warps per block, striding over rows
constexpr int64_t kMinRowsPerChunk = 64;

int64_t col_chunks_for(int64_t rows, int64_t cols, int sm_count) {
  const int64_t tiles = (cols + kColTile - 1) / kColTile;
  const int64_t want_blocks = 8 * static_cast<int64_t>(sm_count);
  const int64_t by_blocks = (want_blocks + tiles - 1) / tiles;
  const int64_t by_size = (rows + kMinRowsPerChunk - 1) / kMinRowsPerChunk;
  const int64_t chunks = by_blocks < by_size ? by_blocks : by_size;
  return chunks > 1 ? chunks : 1;
}

// Block (tile, chunk) folds rows [chunk * len, ...) of its 32 columns; with one chunk it writes the result.
template <class T>
__global__ void __launch_bounds__(kColTile* kColWarps)
    cols_kernel(int op, const T* in, void* out, Acc<compute_t<T>>* partial, int64_t rows, int64_t cols,
                int64_t chunks) {
  using C = compute_t<T>;
  __shared__ Acc<C> acc[kColWarps][kColTile];
  const int lane = threadIdx.x, warp = threadIdx.y;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kColTile + lane;
  const int64_t len = (rows + chunks - 1) / chunks;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * len;
  const int64_t end = begin + len < rows ? begin + len : rows;
  Acc<C> a = identity<C>(op);
  if (col < cols) {
    for (int64_t r = begin + warp; r < end; r += kColWarps)
      a = combine(op, a, element(op, widen(in[r * cols + col]), r));
  }
  acc[warp][lane] = a;
  __syncthreads();
  if (warp != 0 || col >= cols) return;
#pragma unroll
  for (int w = 1; w < kColWarps; ++w) a = combine(op, a, acc[w][lane]);
  if (chunks == 1) {
    write_result<T>(op, a, rows, out, col);
  } else {
    partial[blockIdx.y * cols + col] = a;
  }
}

// Thread per column folds the chunk partials in chunk order.
template <class T>
__global__ void __launch_bounds__(kThreads)
    combine_col_partials_kernel(int op, const Acc<compute_t<T>>* partial, void* out, int64_t rows, int64_t cols,
                                int64_t chunks) {
  using C = compute_t<T>;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (col >= cols) return;
  Acc<C> a = identity<C>(op);
  for (int64_t c = 0; c < chunks; ++c) a = combine(op, a, partial[c * cols + col]);
  write_result<T>(op, a, rows, out, col);
}

}  // namespace

size_t reduce_workspace_bytes(int dtype, int64_t rows, int64_t cols, int sm_count) {
  const int64_t chunks = chunks_for(rows, cols, sm_count);
  return chunks > 1 ? static_cast<size_t>(rows * chunks) * acc_size(dtype) : 0;
}

void launch_reduce_rows(int op, int dtype, const void* in, void* out, int64_t rows, int64_t cols, void* workspace,
                        int sm_count, cudaStream_t stream) {
  if (rows == 0) return;
  const int64_t chunks = chunks_for(rows, cols, sm_count);
  visit_floating(dtype, [&]<class T>() {
    using C = compute_t<T>;
    const T* x = static_cast<const T*>(in);
    if (chunks == 0) {
      const auto grid = static_cast<unsigned>(grid_for_warps(rows, sm_count));
      warp_rows_kernel<T><<<grid, kThreads, 0, stream>>>(op, x, out, rows, cols);
      CPF_CUDA_CHECK_LAUNCH("reduce kernel (warp per row)");
      return;
    }
    auto* partial = static_cast<Acc<C>*>(workspace);
    const auto blocks = static_cast<unsigned>(rows * chunks);
    constexpr int V = vector_width(static_cast<int>(sizeof(T)));
    // Every row starts 16-byte aligned, and so every chunk (chunk_len is a multiple of 8 elements).
    const bool vec = reinterpret_cast<uintptr_t>(x) % 16 == 0 && (rows == 1 || cols % V == 0);
    block_rows_kernel<T><<<blocks, kThreads, 0, stream>>>(op, x, out, partial, rows, cols, chunks, vec);
    CPF_CUDA_CHECK_LAUNCH("reduce kernel (block per row)");
    if (chunks > 1) {
      combine_partials_kernel<T><<<static_cast<unsigned>(rows < 65535 * 16 ? rows : 65535 * 16), kThreads, 0, stream>>>(
          op, partial, out, rows, cols, chunks);
      CPF_CUDA_CHECK_LAUNCH("reduce kernel (partials)");
    }
  });
}

}  // namespace cpf::cuda::kernels

namespace cpf::cuda::kernels {

size_t reduce_cols_workspace_bytes(int dtype, int64_t rows, int64_t cols, int sm_count) {
  const int64_t chunks = col_chunks_for(rows, cols, sm_count);
  return chunks > 1 ? static_cast<size_t>(cols * chunks) * acc_size(dtype) : 0;
}

void launch_reduce_cols(int op, int dtype, const void* in, void* out, int64_t rows, int64_t cols, void* workspace,
                        int sm_count, cudaStream_t stream) {
  if (cols == 0) return;
  const int64_t chunks = col_chunks_for(rows, cols, sm_count);
  visit_floating(dtype, [&]<class T>() {
    using C = compute_t<T>;
    auto* partial = static_cast<Acc<C>*>(workspace);
    const dim3 block(kColTile, kColWarps);
    const dim3 grid(static_cast<unsigned>((cols + kColTile - 1) / kColTile), static_cast<unsigned>(chunks));
    cols_kernel<T><<<grid, block, 0, stream>>>(op, static_cast<const T*>(in), out, partial, rows, cols, chunks);
    CPF_CUDA_CHECK_LAUNCH("reduce kernel (columns)");
    if (chunks > 1) {
      const auto blocks = static_cast<unsigned>((cols + kThreads - 1) / kThreads);
      combine_col_partials_kernel<T><<<blocks, kThreads, 0, stream>>>(op, partial, out, rows, cols, chunks);
      CPF_CUDA_CHECK_LAUNCH("reduce kernel (column partials)");
    }
  });
}

}  // namespace cpf::cuda::kernels
