// Row kernels of the unfused attention path (unfused_kernels.cuh): one thread block per row of
// scores, warp-shuffle reductions combined across warps in a fixed order (deterministic).
//
// The forward softmax keeps rows of up to 32 x 256 scores in registers (one read, one write); longer
// rows are read three times (max, sum of exponentials, write P), with the masked entries set to -inf
// in the first pass so the later passes need no positions.
#include <algorithm>
#include <cmath>

#include "attention/cuda/unfused_kernels.cuh"
#include "framework/tensor/cuda/cuda_check.cuh"

namespace cpf::attention_cuda::unfused {
namespace {

constexpr int kMaxThreads = 256;

__device__ __forceinline__ float exp_of(float x) { return expf(x); }
__device__ __forceinline__ double exp_of(double x) { return exp(x); }
__device__ __forceinline__ float log_of(float x) { return logf(x); }
__device__ __forceinline__ double log_of(double x) { return log(x); }

// The mask predicate of attention/mask.h (position_visible), on the device.
__device__ __forceinline__ bool visible(int64_t pq, int64_t pk, int64_t left, int64_t right) {
  return (right < 0 || pk <= pq + right) && (left < 0 || pk >= pq - left);
}

struct MaxOp {
  template <class T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return b > a ? b : a;
  }
};
struct SumOp {
  template <class T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return a + b;
  }
};

// Every thread of the block gets op over all threads' values. The warps' partials are combined in
// warp order by every thread (at most 8), so the result does not depend on timing.
template <class T, class Op>
__device__ T block_reduce(T v, Op op, T* shared) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  const int warps = static_cast<int>(blockDim.x >> 5);
  if (warps == 1) return v;
  if ((threadIdx.x & 31) == 0) shared[threadIdx.x >> 5] = v;
  __syncthreads();
  T r = shared[0];
  for (int w = 1; w < warps; ++w) r = op(r, shared[w]);
  __syncthreads();  // `shared` is reused by the next reduction
  return r;
}

__device__ __forceinline__ int64_t lse_index(const ScoreRows& p, int64_t g, int64_t r) {
  const int64_t head = p.head0 + g * p.head_step;
  return (p.lse_row * p.h_q + head) * p.s_q + p.lse_col0 + r;
}

template <class T>
__global__ void __launch_bounds__(kMaxThreads) softmax_rows_kernel(ScoreRows p, T* scores, T* lse) {
  __shared__ T shared[kMaxThreads / 32];
  const int64_t row = blockIdx.x;
  const int64_t g = row / p.rows, r = row - g * p.rows;
  T* s = scores + row * p.cols;
  const bool masked = p.window_left >= 0 || p.window_right >= 0;
  const int64_t qp = p.q_pos[r];
  constexpr T kNegInf = -static_cast<T>(INFINITY);

  T m = kNegInf;
  for (int64_t j = threadIdx.x; j < p.cols; j += blockDim.x) {
    T x = s[j];
    if (masked && !visible(qp, p.kv_pos[j], p.window_left, p.window_right)) {
      x = kNegInf;
      s[j] = x;  // read back by this same thread below
    }
    m = x > m ? x : m;
  }
  m = block_reduce(m, MaxOp{}, shared);
  const int64_t li = lse_index(p, g, r);
  if (m == kNegInf) {  // no visible key: P = 0, lse = -inf
    for (int64_t j = threadIdx.x; j < p.cols; j += blockDim.x) s[j] = T(0);
    if (threadIdx.x == 0) lse[li] = kNegInf;
    return;
  }
  T sum = T(0);
  for (int64_t j = threadIdx.x; j < p.cols; j += blockDim.x) sum += exp_of(s[j] - m);  // exp(-inf) = 0
  sum = block_reduce(sum, SumOp{}, shared);
  const T inv = T(1) / sum;
  for (int64_t j = threadIdx.x; j < p.cols; j += blockDim.x) s[j] = exp_of(s[j] - m) * inv;
  if (threadIdx.x == 0) lse[li] = m + log_of(sum);
}

// The forward for rows of at most kItems * blockDim.x scores: the row stays in registers (thread t
// holds columns t, t + blockDim.x, ...), so it is read once and written once. Same arithmetic in the
// same order as softmax_rows_kernel, hence bitwise the same result.
template <class T, int kItems>
__global__ void __launch_bounds__(kMaxThreads) softmax_rows_registers_kernel(ScoreRows p, T* scores, T* lse) {
  __shared__ T shared[kMaxThreads / 32];
  const int64_t row = blockIdx.x;
  const int64_t g = row / p.rows, r = row - g * p.rows;
  T* s = scores + row * p.cols;
  const bool masked = p.window_left >= 0 || p.window_right >= 0;
  const int64_t qp = p.q_pos[r];
  constexpr T kNegInf = -static_cast<T>(INFINITY);

  T x[kItems];
  T m = kNegInf;
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int64_t j = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
    T value = kNegInf;
    if (j < p.cols) {
      value = s[j];
      if (masked && !visible(qp, p.kv_pos[j], p.window_left, p.window_right)) value = kNegInf;
    }
    x[i] = value;
    m = value > m ? value : m;
  }
  m = block_reduce(m, MaxOp{}, shared);
  const int64_t li = lse_index(p, g, r);
  if (m == kNegInf) {  // no visible key: P = 0, lse = -inf
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int64_t j = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
      if (j < p.cols) s[j] = T(0);
    }
    if (threadIdx.x == 0) lse[li] = kNegInf;
    return;
  }
  T sum = T(0);
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    x[i] = exp_of(x[i] - m);  // exp(-inf) = 0 for masked and out-of-row entries
    sum += x[i];
  }
  sum = block_reduce(sum, SumOp{}, shared);
  const T inv = T(1) / sum;
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int64_t j = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
    if (j < p.cols) s[j] = x[i] * inv;
  }
  if (threadIdx.x == 0) lse[li] = m + log_of(sum);
}

template <class T>
__global__ void __launch_bounds__(kMaxThreads)
    backward_rows_kernel(ScoreRows p, T* scores, T* dp, const T* lse, const T* delta) {
  const int64_t row = blockIdx.x;
  const int64_t g = row / p.rows, r = row - g * p.rows;
  T* s = scores + row * p.cols;
  T* d = dp + row * p.cols;
  const bool masked = p.window_left >= 0 || p.window_right >= 0;
  const int64_t qp = p.q_pos[r];
  const int64_t li = lse_index(p, g, r);
  const T l = lse[li], dl = delta[li];
  // A row with lse = -inf saw no key: all its probabilities are 0 (exp(-inf + inf) would be NaN).
  const bool none = l == -static_cast<T>(INFINITY);
  for (int64_t j = threadIdx.x; j < p.cols; j += blockDim.x) {
    T prob = T(0);
    if (!none && (!masked || visible(qp, p.kv_pos[j], p.window_left, p.window_right))) prob = exp_of(s[j] - l);
    s[j] = prob;
    d[j] = prob * (d[j] - dl);
  }
}

template <class T>
__global__ void __launch_bounds__(kMaxThreads)
    delta_kernel(DeltaParams p, const T* out, const T* dout, const T* dlse, T* delta, int64_t entries) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int64_t warps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5; i < entries; i += warps) {
    const int64_t s = i % p.s_q, h = (i / p.s_q) % p.h_q, b = i / (p.s_q * p.h_q);
    const int64_t token = p.sbhd ? s * p.batch + b : b * p.s_q + s;
    const int64_t off = (token * p.h_q + h) * p.d_v;
    T sum = T(0);
    for (int64_t e = lane; e < p.d_v; e += 32) sum += out[off + e] * dout[off + e];
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) delta[i] = sum - (dlse != nullptr ? dlse[i] : T(0));
  }
}

// Enough threads to cover a row in a few strides, a warp at least.
int threads_for(int64_t cols) {
  int threads = 32;
  while (threads < kMaxThreads && threads < cols) threads *= 2;
  return threads;
}

unsigned row_blocks(const ScoreRows& p) {
  const int64_t blocks = p.groups * p.rows;
  CPF_CHECK(blocks > 0 && blocks < (int64_t(1) << 31), "attention (unfused): score chunk of ", p.groups, " x ", p.rows,
            " rows does not fit one launch (internal: the chunking bounds it)");
  return static_cast<unsigned>(blocks);
}

}  // namespace

template <class T>
void launch_softmax_rows(const ScoreRows& rows, T* scores, T* lse, cudaStream_t stream) {
  const unsigned blocks = row_blocks(rows);
  const int threads = threads_for(rows.cols);
  const int64_t items = (rows.cols + threads - 1) / threads;  // columns per thread
  if (items <= 1) {
    softmax_rows_registers_kernel<T, 1><<<blocks, threads, 0, stream>>>(rows, scores, lse);
  } else if (items <= 2) {
    softmax_rows_registers_kernel<T, 2><<<blocks, threads, 0, stream>>>(rows, scores, lse);
  } else if (items <= 4) {
    softmax_rows_registers_kernel<T, 4><<<blocks, threads, 0, stream>>>(rows, scores, lse);
  } else if (items <= 8) {
    softmax_rows_registers_kernel<T, 8><<<blocks, threads, 0, stream>>>(rows, scores, lse);
  } else if (items <= 16) {
    softmax_rows_registers_kernel<T, 16><<<blocks, threads, 0, stream>>>(rows, scores, lse);
  } else if (items <= 32) {
    softmax_rows_registers_kernel<T, 32><<<blocks, threads, 0, stream>>>(rows, scores, lse);
  } else {
    softmax_rows_kernel<T><<<blocks, threads, 0, stream>>>(rows, scores, lse);  // rows over 8192 scores
  }
  CPF_CUDA_CHECK_LAUNCH("attention (unfused): softmax_rows_kernel");
}

template <class T>
void launch_backward_rows(const ScoreRows& rows, T* scores, T* dp, const T* lse, const T* delta, cudaStream_t stream) {
  backward_rows_kernel<T><<<row_blocks(rows), threads_for(rows.cols), 0, stream>>>(rows, scores, dp, lse, delta);
  CPF_CUDA_CHECK_LAUNCH("attention (unfused): backward_rows_kernel");
}

template <class T>
void launch_delta(const DeltaParams& params, const T* out, const T* dout, const T* dlse, T* delta,
                  cudaStream_t stream) {
  const int64_t entries = params.batch * params.h_q * params.s_q;
  if (entries == 0) return;
  const int64_t warps_per_block = kMaxThreads / 32;
  const int64_t blocks = std::min<int64_t>((entries + warps_per_block - 1) / warps_per_block, int64_t(1) << 20);
  delta_kernel<T><<<static_cast<unsigned>(blocks), kMaxThreads, 0, stream>>>(params, out, dout, dlse, delta, entries);
  CPF_CUDA_CHECK_LAUNCH("attention (unfused): delta_kernel");
}

template void launch_softmax_rows<float>(const ScoreRows&, float*, float*, cudaStream_t);
template void launch_softmax_rows<double>(const ScoreRows&, double*, double*, cudaStream_t);
template void launch_backward_rows<float>(const ScoreRows&, float*, float*, const float*, const float*, cudaStream_t);
template void launch_backward_rows<double>(const ScoreRows&, double*, double*, const double*, const double*,
                                           cudaStream_t);
template void launch_delta<float>(const DeltaParams&, const float*, const float*, const float*, float*, cudaStream_t);
template void launch_delta<double>(const DeltaParams&, const double*, const double*, const double*, double*,
                                   cudaStream_t);

}  // namespace cpf::attention_cuda::unfused
