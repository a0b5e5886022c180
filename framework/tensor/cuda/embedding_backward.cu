// The embedding gradient on the device, with no host round trip and a cost that scales with the tokens
// (not the vocabulary): out[v] = the sum over the positions i with ids[i] == v of grad[i], in the order
// of framework/tensor/ops/embedding.h (kEmbeddingSegment): each id's occurrences in position order, in
// segments of S; each segment summed from 0, the segments' sums added in order.
//
//   1. keys = ids (an out-of-range id, reported by the caller's device-side check, gets key V and is
//      skipped), values = positions 0..N-1;
//   2. a stable LSD radix sort of (key, position) pairs (CUB, end bit = the bits of V): equal ids end up
//      adjacent, their positions still ascending;
//   3. one thread per sorted index marks segment starts (a run's first index, and every S-th after it)
//      and whether its run is long (more than S rows);
//   4. out = 0, then one block per segment start, its threads over the columns, adds the segment's rows
//      from 0; a short run's sum goes to out, a long run's segment sums to a partial slot;
//   5. one block per long run adds its partials in order into out.
// The order per element is the CPU's, so the result is bitwise the CPU's and the same on every run; no
// atomics. A long run (a padding, end-of-text or frequent id) is spread over ceil(L / S) blocks instead
// of one block adding L rows.
#include <cub/device/device_radix_sort.cuh>

#include "framework/tensor/cuda/elementwise.cuh"
#include "framework/tensor/ops/embedding_segment.h"

namespace cpf::cuda::kernels {
namespace {

constexpr int64_t kSegment = raw::kEmbeddingSegment;
// Rows loaded ahead of their adds (segment_sum_kernel).
constexpr int kAhead = 16;
static_assert(kSegment % kAhead == 0, "a segment is whole look-ahead groups");

// flags of a sorted index (mark_kernel)
constexpr uint32_t kSegmentStart = 1, kRunStart = 2, kLongRun = 4;

int key_bits(int64_t rows) {
  int bits = 1;
  while (bits < 32 && (int64_t{1} << bits) <= rows) ++bits;  // key V (skipped ids) must fit too
  return bits;
}

// Partial slots: a tile of S sorted indices holds at most one segment start of a long run that began
// before it (slot 2 * tile) and at most one long run's first index (slot 2 * tile + 1), since a long
// run that starts in a tile reaches past its end.
int64_t partial_slots(int64_t n) { return 2 * ((n + kSegment - 1) / kSegment); }

__device__ __forceinline__ int64_t slot_of(int64_t k, bool run_start) {
  return 2 * (k / kSegment) + (run_start ? 1 : 0);
}

struct Layout {
  size_t keys_in = 0, keys_out = 0, values_in = 0, values_out = 0, flags = 0, partials = 0, sort = 0, sort_bytes = 0,
         total = 0;
};

Layout layout_of(int64_t n, int64_t rows, int64_t cols, size_t compute_bytes) {
  const auto align = [](size_t b) { return (b + 255) / 256 * 256; };
  const size_t words = align(static_cast<size_t>(n) * sizeof(uint32_t));
  Layout l;
  l.keys_out = words;
  l.values_in = 2 * words;
  l.values_out = 3 * words;
  l.flags = 4 * words;
  l.partials = 5 * words;
  l.sort = l.partials + align(static_cast<size_t>(partial_slots(n) * cols) * compute_bytes);
  CPF_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, l.sort_bytes, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr), static_cast<int>(n), 0, key_bits(rows)));
  l.total = l.sort + align(l.sort_bytes);
  return l;
}

size_t compute_bytes_of(int dtype) {
  size_t bytes = 0;
  visit_floating(dtype, [&]<class T>() { bytes = sizeof(compute_t<T>); });
  return bytes;
}

template <class I>
__global__ void __launch_bounds__(kThreads)
    sort_keys_kernel(const I* ids, uint32_t* keys, uint32_t* positions, int64_t n, int64_t rows) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t id = static_cast<int64_t>(ids[i]);
    keys[i] = static_cast<uint32_t>(id >= 0 && id < rows ? id : rows);
    positions[i] = static_cast<uint32_t>(i);
  }
}

// One thread per sorted index: its run's first index by binary search in the sorted keys, then the flags.
__global__ void __launch_bounds__(kThreads)
    mark_kernel(const uint32_t* keys, uint32_t* flags, int64_t n, int64_t rows) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += stride) {
    const uint32_t key = keys[k];
    if (key >= rows) {
      flags[k] = 0;
      continue;
    }
    int64_t low = 0, high = k;  // the first index in [0, k] whose key is `key`
    while (low < high) {
      const int64_t mid = (low + high) / 2;
      if (keys[mid] < key)
        low = mid + 1;
      else
        high = mid;
    }
    const int64_t start = low;
    const bool is_long = start + kSegment < n && keys[start + kSegment] == key;
    uint32_t f = (k - start) % kSegment == 0 ? kSegmentStart : 0;
    if (k == start) f |= kRunStart;
    if (is_long) f |= kLongRun;
    flags[k] = f;
  }
}

// blockIdx.x = sorted index (a segment start does the work), blockIdx.y * blockDim.x + threadIdx.x =
// column. The adds stay in position order; the loads of kAhead rows are issued before their adds. Both
// loops unroll fully: the arrays stay in registers.
template <class T>
__global__ void __launch_bounds__(kThreads)
    segment_sum_kernel(const T* grad, const uint32_t* keys, const uint32_t* positions, const uint32_t* flags,
                       compute_t<T>* out, compute_t<T>* partials, int64_t n, int64_t cols) {
  using C = compute_t<T>;
  const int64_t start = blockIdx.x;
  const uint32_t f = flags[start];
  if (!(f & kSegmentStart)) return;
  const int64_t col = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  const uint32_t key = keys[start];
  const int64_t end = start + kSegment < n ? start + kSegment : n;
  C s = C(0);
  for (int64_t k = start; k < end; k += kAhead) {
    C row[kAhead];
    bool in[kAhead];
#pragma unroll
    for (int j = 0; j < kAhead; ++j) {
      in[j] = k + j < end && keys[k + j] == key;  // sorted: once false, false for the rest
      row[j] = in[j] ? widen(grad[static_cast<int64_t>(positions[k + j]) * cols + col]) : C(0);
    }
#pragma unroll
    for (int j = 0; j < kAhead; ++j) {
      if (in[j]) s += row[j];
    }
    if (!in[kAhead - 1]) break;
  }
  if (f & kLongRun) {
    partials[slot_of(start, f & kRunStart) * cols + col] = s;
  } else {
    out[static_cast<int64_t>(key) * cols + col] = s;
  }
}

// blockIdx.x = sorted index (a long run's first index does the work): its segments' sums in order.
template <class C>
__global__ void __launch_bounds__(kThreads)
    combine_kernel(const uint32_t* keys, const uint32_t* flags, const C* partials, C* out, int64_t n, int64_t cols) {
  const int64_t start = blockIdx.x;
  const uint32_t f = flags[start];
  if ((f & (kRunStart | kLongRun)) != (kRunStart | kLongRun)) return;
  const int64_t col = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  const uint32_t key = keys[start];
  C s = partials[slot_of(start, true) * cols + col];
  for (int64_t k = start + kSegment; k < n && keys[k] == key; k += kSegment) {
    s += partials[slot_of(k, false) * cols + col];
  }
  out[static_cast<int64_t>(key) * cols + col] = s;
}

}  // namespace

size_t embedding_backward_workspace(int64_t n, int64_t rows, int64_t cols, int dtype) {
  return n == 0 ? 0 : layout_of(n, rows, cols, compute_bytes_of(dtype)).total;
}

void launch_embedding_backward(int dtype, int id_dtype, const void* grad, const void* ids, void* out, int64_t n,
                               int64_t rows, int64_t cols, void* workspace, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const size_t compute_bytes = compute_bytes_of(dtype);
  CPF_CUDA_CHECK(cudaMemsetAsync(out, 0, static_cast<size_t>(rows * cols) * compute_bytes, stream));
  if (n == 0) return;
  const Layout l = layout_of(n, rows, cols, compute_bytes);
  char* w = static_cast<char*>(workspace);
  auto* keys_in = reinterpret_cast<uint32_t*>(w + l.keys_in);
  auto* keys_out = reinterpret_cast<uint32_t*>(w + l.keys_out);
  auto* values_in = reinterpret_cast<uint32_t*>(w + l.values_in);
  auto* values_out = reinterpret_cast<uint32_t*>(w + l.values_out);
  auto* flags = reinterpret_cast<uint32_t*>(w + l.flags);
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  const unsigned grid = static_cast<unsigned>(blocks < 65535 * 32 ? blocks : 65535 * 32);
  if (id_dtype == kI32) {
    sort_keys_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const int32_t*>(ids), keys_in, values_in, n, rows);
  } else {
    sort_keys_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const int64_t*>(ids), keys_in, values_in, n, rows);
  }
  CPF_CUDA_CHECK_LAUNCH("embedding backward keys kernel");
  size_t sort_bytes = l.sort_bytes;
  CPF_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(w + l.sort, sort_bytes, keys_in, keys_out, values_in, values_out,
                                                 static_cast<int>(n), 0, key_bits(rows), stream));
  mark_kernel<<<grid, kThreads, 0, stream>>>(keys_out, flags, n, rows);
  CPF_CUDA_CHECK_LAUNCH("embedding backward mark kernel");
  visit_floating(dtype, [&]<class T>() {
    using C = compute_t<T>;
    auto* partials = reinterpret_cast<C*>(w + l.partials);
    const dim3 sum_grid(static_cast<unsigned>(n), static_cast<unsigned>((cols + kThreads - 1) / kThreads));
    segment_sum_kernel<T><<<sum_grid, kThreads, 0, stream>>>(static_cast<const T*>(grad), keys_out, values_out, flags,
                                                             static_cast<C*>(out), partials, n, cols);
    CPF_CUDA_CHECK_LAUNCH("embedding backward segment-sum kernel");
    combine_kernel<C><<<sum_grid, kThreads, 0, stream>>>(keys_out, flags, partials, static_cast<C*>(out), n, cols);
    CPF_CUDA_CHECK_LAUNCH("embedding backward combine kernel");
  });
}

}  // namespace cpf::cuda::kernels
