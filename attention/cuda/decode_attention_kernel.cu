// Decoding attention (decode_attention_kernel.cuh): one block per (head, sequence, split), kWarps warps.
// With new rows to append, the first split's block of the first query head of each kv head stores them
// into the cache, and every block reads the newest position from the new rows themselves (never the row
// being stored). Each warp walks every kWarps-th position of the block's share with an online softmax (its
// running max, denominator and weighted sum of values in registers: lane c holds dims c, c + 32, ...); the
// warps then merge their partial rows through shared memory. One split: the block adds the sink to the
// denominator and writes the row. Several (few sequences x heads, long slots):
//
//   positions [first, len) of (n, h):  | split 0 | split 1 | ... | split S-1 |   (ceil((len - first) / S) each)
//                                           |         |               |
//   partials (n, h, s, D_v + 2):        [acc | max | sum] per split, acc relative to that split's max
//                                           \_________|______________/
//   combine kernel, a block per (h, n):  the same merge over the splits, the sink, one write of the row
//
// The lengths are read on the device, so one captured graph serves every step; a length outside
// [0, capacity] (reported by the index check the caller enqueues) is clamped, never read past the slot.
#include <cfloat>

#include "attention/cuda/decode_attention_kernel.cuh"
#include "framework/core/error.h"
#include "framework/tensor/cuda/elementwise.cuh"

namespace cpf::attention_cuda::decode {
namespace {

using cuda::kernels::bf16;
using cuda::kernels::compute_t;
using cuda::kernels::narrow;
using cuda::kernels::widen;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxParts = kWarps > kMaxSplits ? kWarps : kMaxSplits;  // partial rows one merge takes

__device__ __forceinline__ float exp_of(float x) { return __expf(x); }
__device__ __forceinline__ double exp_of(double x) { return exp(x); }

template <class A>
__device__ __forceinline__ A warp_sum(A v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Merging partial rows (acc_i relative to max_i, with denominators sum_i): the common max and each part's
// weight exp(max_i - top); a part that saw no key (sum 0) weighs nothing. Returns the top.
template <class A>
__device__ A merge_weights(const A* part_max, const A* part_sum, int parts, A* weight) {
  A top = -static_cast<A>(INFINITY);
  for (int w = 0; w < parts; ++w) top = part_max[w] > top ? part_max[w] : top;
  for (int w = 0; w < parts; ++w) weight[w] = part_sum[w] > 0 ? exp_of(part_max[w] - top) : A(0);
  return top;
}

// The row of (n, h) from `parts` partial rows (acc of part w at part_acc + w * acc_stride): merged, the sink
// in the denominator, written once (zeros for a row that sees no key).
template <class T, class A>
__device__ void write_row(const DecodeLaunch& a, const A* part_acc, int64_t acc_stride, const A* part_max,
                          const A* part_sum, int parts, int64_t len, int64_t n, int64_t h) {
  A weight[kMaxParts];
  const A top = merge_weights(part_max, part_sum, parts, weight);
  T* out = static_cast<T*>(a.out) + (n * a.heads + h) * a.dim_v;
  if (len == 0) {  // no key: zeros, as a fully masked row
    for (int64_t c = threadIdx.x; c < a.dim_v; c += kThreads) out[c] = narrow<T>(A(0));
    return;
  }
  A denom = a.sink != nullptr ? exp_of(static_cast<const A*>(a.sink)[h] - top) : A(0);
  for (int w = 0; w < parts; ++w) denom += part_sum[w] * weight[w];
  for (int64_t c = threadIdx.x; c < a.dim_v; c += kThreads) {
    A o = 0;
    for (int w = 0; w < parts; ++w) o += part_acc[w * acc_stride + c] * weight[w];
    out[c] = narrow<T>(o / denom);
  }
}

// The block's partial row over its split, merged over the warps (no sink, not divided): row (n, h, split)
// of the partials, [acc (D_v) | max | sum].
template <class A>
__device__ void write_partial(const DecodeLaunch& a, const A* part_acc, const A* part_max, const A* part_sum, int64_t n,
                              int64_t h) {
  A weight[kWarps];
  const A top = merge_weights(part_max, part_sum, kWarps, weight);
  A* row = static_cast<A*>(a.partials) + ((n * a.heads + h) * a.splits + blockIdx.z) * (a.dim_v + 2);
  for (int64_t c = threadIdx.x; c < a.dim_v; c += kThreads) {
    A o = 0;
    for (int w = 0; w < kWarps; ++w) o += part_acc[w * a.dim_v + c] * weight[w];
    row[c] = o;
  }
  if (threadIdx.x == 0) {
    A sum = 0;
    for (int w = 0; w < kWarps; ++w) sum += part_sum[w] * weight[w];
    row[a.dim_v] = top;
    row[a.dim_v + 1] = sum;
  }
}

// Sequence n's length, clamped to [0, capacity] (the caller's index check reports one outside).
template <class L>
__device__ __forceinline__ int64_t clamped_length(const DecodeLaunch& a, int64_t n) {
  const auto len = static_cast<int64_t>(static_cast<const L*>(a.lengths)[n]);
  return len < 0 ? 0 : (len > a.capacity ? a.capacity : len);
}

// Stores the new key and value rows of (sequence n, kv head) at the slot's newest position.
template <class T>
__device__ void store_new_row(const DecodeLaunch& a, const T* k_new, const T* v_new, int64_t len, int64_t n,
                              int64_t kv_head) {
  const int64_t row = (n * a.capacity + len - 1) * a.kv_heads + kv_head;
  for (int64_t c = threadIdx.x; c < a.dim_qk; c += kThreads) static_cast<T*>(a.keys)[row * a.dim_qk + c] = k_new[c];
  for (int64_t c = threadIdx.x; c < a.dim_v; c += kThreads) static_cast<T*>(a.values)[row * a.dim_v + c] = v_new[c];
}

template <class T, class L, int kPer>
__global__ void __launch_bounds__(kThreads) decode_kernel(DecodeLaunch a) {
  using A = compute_t<T>;
  extern __shared__ unsigned char shared_bytes[];
  A* part_acc = reinterpret_cast<A*>(shared_bytes);  // (kWarps, dim_v)
  __shared__ A part_max[kWarps], part_sum[kWarps];
  const int64_t h = blockIdx.x, n = blockIdx.y;
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const int64_t len = clamped_length<L>(a, n);
  const int64_t first = a.window_left >= 0 && len - 1 - a.window_left > 0 ? len - 1 - a.window_left : 0;
  const int64_t share = (len - first + a.splits - 1) / a.splits;  // positions of each split
  const int64_t begin = first + blockIdx.z * share, end = begin + share < len ? begin + share : len;
  const int64_t kv_head = h / (a.heads / a.kv_heads);
  const T* q = static_cast<const T*>(a.q) + n * a.q_stride[0] + h * a.q_stride[1];
  const int group = static_cast<int>(a.heads / a.kv_heads);
  const T* k_new = a.k_new == nullptr
                       ? nullptr
                       : static_cast<const T*>(a.k_new) + n * a.k_new_stride[0] + kv_head * a.k_new_stride[1];
  const T* v_new = a.v_new == nullptr
                       ? nullptr
                       : static_cast<const T*>(a.v_new) + n * a.v_new_stride[0] + kv_head * a.v_new_stride[1];
  // The first query head of each kv head stores the new row; every block reads it from k_new / v_new.
  if (k_new != nullptr && len > 0 && h % group == 0 && blockIdx.z == 0) store_new_row(a, k_new, v_new, len, n, kv_head);
  A qr[kPer], acc[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int64_t c = lane + 32 * i;
    qr[i] = c < a.dim_qk ? widen(q[c]) : A(0);
    acc[i] = A(0);
  }
  A run_max = -static_cast<A>(INFINITY), run_sum = 0;
  const A scale = static_cast<A>(a.scale);
  for (int64_t j = begin + warp; j < end; j += kWarps) {
    const int64_t row = (n * a.capacity + j) * a.kv_heads + kv_head;
    const bool fresh = k_new != nullptr && j == len - 1;  // the new row: from k_new / v_new, not the cache
    const T* k = fresh ? k_new : static_cast<const T*>(a.keys) + row * a.dim_qk;
    A s = 0;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int64_t c = lane + 32 * i;
      if (c < a.dim_qk) s += qr[i] * widen(k[c]);
    }
    s = warp_sum(s) * scale;
    const A next_max = s > run_max ? s : run_max;
    const A rescale = exp_of(run_max - next_max);  // 0 for the first key (run_max = -inf)
    const A p = exp_of(s - next_max);
    run_sum = run_sum * rescale + p;
    const T* v = fresh ? v_new : static_cast<const T*>(a.values) + row * a.dim_v;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int64_t c = lane + 32 * i;
      if (c < a.dim_v) acc[i] = acc[i] * rescale + p * widen(v[c]);
    }
    run_max = next_max;
  }
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int64_t c = lane + 32 * i;
    if (c < a.dim_v) part_acc[warp * a.dim_v + c] = acc[i];
  }
  if (lane == 0) {
    part_max[warp] = run_max;
    part_sum[warp] = run_sum;
  }
  __syncthreads();
  if (a.splits == 1) {
    write_row<T>(a, part_acc, a.dim_v, part_max, part_sum, kWarps, len, n, h);
  } else {
    write_partial(a, part_acc, part_max, part_sum, n, h);
  }
}

// Several splits: the row of (h = blockIdx.x, n = blockIdx.y) from its splits' partial rows.
template <class T, class L>
__global__ void __launch_bounds__(kThreads) combine_kernel(DecodeLaunch a) {
  using A = compute_t<T>;
  __shared__ A part_max[kMaxSplits], part_sum[kMaxSplits];
  const int64_t h = blockIdx.x, n = blockIdx.y, width = a.dim_v + 2;
  const A* rows = static_cast<const A*>(a.partials) + (n * a.heads + h) * a.splits * width;
  if (threadIdx.x < a.splits) {
    part_max[threadIdx.x] = rows[threadIdx.x * width + a.dim_v];
    part_sum[threadIdx.x] = rows[threadIdx.x * width + a.dim_v + 1];
  }
  __syncthreads();
  write_row<T>(a, rows, width, part_max, part_sum, a.splits, clamped_length<L>(a, n), n, h);
}

template <class T, class L>
void launch_typed(const DecodeLaunch& a, cudaStream_t stream) {
  const int64_t widest = a.dim_qk > a.dim_v ? a.dim_qk : a.dim_v;
  const dim3 grid(static_cast<unsigned>(a.heads), static_cast<unsigned>(a.seqs), static_cast<unsigned>(a.splits));
  const size_t shared = sizeof(compute_t<T>) * kWarps * static_cast<size_t>(a.dim_v);
  if (widest <= 64) {
    decode_kernel<T, L, 2><<<grid, kThreads, shared, stream>>>(a);
  } else if (widest <= 128) {
    decode_kernel<T, L, 4><<<grid, kThreads, shared, stream>>>(a);
  } else if (widest <= 256) {
    decode_kernel<T, L, 8><<<grid, kThreads, shared, stream>>>(a);
  } else {
    decode_kernel<T, L, kMaxHeadDim / 32><<<grid, kThreads, shared, stream>>>(a);
  }
  CPF_CUDA_CHECK_LAUNCH("decode attention kernel");
  if (a.splits > 1) {
    combine_kernel<T, L>
        <<<dim3(static_cast<unsigned>(a.heads), static_cast<unsigned>(a.seqs)), kThreads, 0, stream>>>(a);
    CPF_CUDA_CHECK_LAUNCH("decode attention combine kernel");
  }
}

}  // namespace

int decode_splits(int64_t seqs, int64_t heads, int64_t capacity, int sm_count) {
  constexpr int64_t kMinPositions = 32;  // below this a split's block costs more than its positions save
  const int64_t blocks = seqs * heads;
  if (blocks <= 0 || blocks >= sm_count) return 1;
  int64_t splits = (2 * static_cast<int64_t>(sm_count) + blocks - 1) / blocks;
  splits = splits < capacity / kMinPositions ? splits : capacity / kMinPositions;
  splits = splits < kMaxSplits ? splits : kMaxSplits;
  return static_cast<int>(splits > 1 ? splits : 1);
}

void launch_decode_attention(const DecodeLaunch& a, cudaStream_t stream) {
  CPF_CHECK(a.splits >= 1 && a.splits <= kMaxSplits && (a.splits == 1 || a.partials != nullptr),
            "decode attention: ", a.splits, " splits (1 to ", kMaxSplits, ", several need the partials buffer)");
  if (a.seqs == 0 || a.heads == 0 || a.dim_v == 0) return;
  cuda::kernels::visit_floating(a.dtype, [&]<class T>() {
    cuda::kernels::visit_index(a.length_dtype, [&]<class L>() { launch_typed<T, L>(a, stream); });
  });
}

}  // namespace cpf::attention_cuda::decode
