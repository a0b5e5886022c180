// The embedding gradient on the device, with no host round trip and a cost that scales with the tokens
// (not the vocabulary): out[v] = sum over the positions i with ids[i] == v of grad[i], in position order.
//
//   1. keys = ids (an out-of-range id, reported by the caller's device-side check, gets key V and is
//      skipped), values = positions 0..N-1;
//   2. a stable LSD radix sort of (key, position) pairs (CUB, end bit = the bits of V): equal ids end up
//      adjacent, their positions still ascending;
//   3. out = 0, then one block per run of equal keys (the block whose sorted index starts the run; every
//      other block returns at once), its threads over the columns, adds the run's grad rows one after
//      the other from 0 in the compute type.
// Step 3's order per element is the CPU's (framework/tensor/ops/embedding.cpp adds grad rows in ids
// order from 0), so the result is bitwise the CPU's and the same on every run; no atomics.
#include <cub/device/device_radix_sort.cuh>

#include "framework/tensor/cuda/elementwise.cuh"

namespace cpf::cuda::kernels {
namespace {

// Rows loaded ahead of their adds (run_sum_kernel).
constexpr int kAhead = 16;

int key_bits(int64_t rows) {
  int bits = 1;
  while (bits < 32 && (int64_t{1} << bits) <= rows) ++bits;  // key V (skipped ids) must fit too
  return bits;
}

struct Layout {
  size_t keys_in = 0, keys_out = 0, values_in = 0, values_out = 0, sort = 0, sort_bytes = 0, total = 0;
};

Layout layout_of(int64_t n, int64_t rows) {
  const auto align = [](size_t b) { return (b + 255) / 256 * 256; };
  const size_t words = align(static_cast<size_t>(n) * sizeof(uint32_t));
  Layout l;
  l.keys_out = words;
  l.values_in = 2 * words;
  l.values_out = 3 * words;
  l.sort = 4 * words;
  CPF_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, l.sort_bytes, static_cast<const uint32_t*>(nullptr),
                                                 static_cast<uint32_t*>(nullptr), static_cast<const uint32_t*>(nullptr),
                                                 static_cast<uint32_t*>(nullptr), static_cast<int>(n), 0,
                                                 key_bits(rows)));
  l.total = l.sort + align(l.sort_bytes);
  return l;
}

template <class I>
__global__ void __launch_bounds__(kThreads) sort_keys_kernel(const I* ids, uint32_t* keys, uint32_t* positions,
                                                             int64_t n, int64_t rows) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t id = static_cast<int64_t>(ids[i]);
    keys[i] = static_cast<uint32_t>(id >= 0 && id < rows ? id : rows);
    positions[i] = static_cast<uint32_t>(i);
  }
}

// blockIdx.x = sorted index (a run start does the work), blockIdx.y * blockDim.x + threadIdx.x = column.
// The adds stay in position order (the CPU's); the loads of kAhead rows are issued before their adds, so
// a long run (a padding or end-of-text id) pays one memory latency per kAhead rows. Both loops unroll
// fully: the arrays stay in registers.
template <class T>
__global__ void __launch_bounds__(kThreads) run_sum_kernel(const T* grad, const uint32_t* keys,
                                                           const uint32_t* positions, compute_t<T>* out, int64_t n,
                                                           int64_t rows, int64_t cols) {
  using C = compute_t<T>;
  const int64_t start = blockIdx.x;
  const uint32_t key = keys[start];
  if (key >= rows || (start > 0 && keys[start - 1] == key)) return;
  const int64_t col = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  C s = C(0);
  for (int64_t k = start;; k += kAhead) {
    C row[kAhead];
    bool in[kAhead];
#pragma unroll
    for (int j = 0; j < kAhead; ++j) {
      in[j] = k + j < n && keys[k + j] == key;  // sorted: once false, false for the rest
      row[j] = in[j] ? widen(grad[static_cast<int64_t>(positions[k + j]) * cols + col]) : C(0);
    }
#pragma unroll
    for (int j = 0; j < kAhead; ++j) {
      if (in[j]) s += row[j];
    }
    if (!in[kAhead - 1]) break;
  }
  out[static_cast<int64_t>(key) * cols + col] = s;
}

}  // namespace

size_t embedding_backward_workspace(int64_t n, int64_t rows) { return n == 0 ? 0 : layout_of(n, rows).total; }

void launch_embedding_backward(int dtype, int id_dtype, const void* grad, const void* ids, void* out, int64_t n,
                               int64_t rows, int64_t cols, void* workspace, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  visit_floating(dtype, [&]<class T>() {
    CPF_CUDA_CHECK(cudaMemsetAsync(out, 0, static_cast<size_t>(rows * cols) * sizeof(compute_t<T>), stream));
  });
  if (n == 0) return;
  const Layout l = layout_of(n, rows);
  char* w = static_cast<char*>(workspace);
  auto* keys_in = reinterpret_cast<uint32_t*>(w + l.keys_in);
  auto* keys_out = reinterpret_cast<uint32_t*>(w + l.keys_out);
  auto* values_in = reinterpret_cast<uint32_t*>(w + l.values_in);
  auto* values_out = reinterpret_cast<uint32_t*>(w + l.values_out);
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
  visit_floating(dtype, [&]<class T>() {
    const dim3 sum_grid(static_cast<unsigned>(n), static_cast<unsigned>((cols + kThreads - 1) / kThreads));
    run_sum_kernel<T><<<sum_grid, kThreads, 0, stream>>>(static_cast<const T*>(grad), keys_out, values_out,
                                                         static_cast<compute_t<T>*>(out), n, rows, cols);
    CPF_CUDA_CHECK_LAUNCH("embedding backward run-sum kernel");
  });
}

}  // namespace cpf::cuda::kernels
