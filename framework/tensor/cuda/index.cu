// Indexing kernels: gathers (index_select, gather, embedding), deterministic scatter-adds
// (scatter_add, index_add_) (the embedding gradient is in embedding_backward.cu).
//
// Determinism without atomics: in scatter_add / index_add_ two terms can only meet in one destination
// when they lie on the same line along the indexed dim, so one thread owns a line and adds its terms
// in index-position order (the CPU's order).
#include "framework/tensor/cuda/elementwise.cuh"

namespace cpf::cuda::kernels {
namespace {

// Storage moved as unsigned words of the element size.
template <class Fn>
void visit_size(int elem_size, Fn&& fn) {
  switch (elem_size) {
    case 1: fn.template operator()<uint8_t>(); return;
    case 2: fn.template operator()<uint16_t>(); return;
    case 4: fn.template operator()<uint32_t>(); return;
    default: fn.template operator()<uint64_t>(); return;
  }
}

template <class T, class I>
__global__ void __launch_bounds__(kThreads) gather_kernel(Iter it, int64_t x_step, int64_t x_bound) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nthreads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  T* out = static_cast<T*>(it.data[0]);
  const I* index = static_cast<const I*>(it.data[1]);
  const T* x = static_cast<const T*>(it.data[2]);
  for (int64_t i = tid; i < it.numel; i += nthreads) {
    int64_t off[3];
    offsets_of<3>(it, i, off);
    // An out-of-range index (reported by the device-side check) reads nothing and gives 0.
    const int64_t v = static_cast<int64_t>(index[off[1]]);
    out[off[0]] = v >= 0 && v < x_bound ? x[off[2] + v * x_step] : T(0);
  }
}

template <class A, class S, class I>
__global__ void __launch_bounds__(kThreads)
    scatter_lines_kernel(Iter it, int64_t len, int64_t acc_step, int64_t index_step, int64_t src_step,
                         int64_t acc_bound) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nthreads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t line = tid; line < it.numel; line += nthreads) {
    int64_t off[3];
    offsets_of<3>(it, line, off);
    A* acc = static_cast<A*>(it.data[0]) + off[0];
    const I* index = static_cast<const I*>(it.data[1]) + off[1];
    const S* src = static_cast<const S*>(it.data[2]) + off[2];
    for (int64_t j = 0; j < len; ++j) {
      const int64_t v = static_cast<int64_t>(index[j * index_step]);
      if (v < 0 || v >= acc_bound) continue;  // reported by the device-side check; never written out of bounds
      acc[v * acc_step] += static_cast<A>(widen(src[j * src_step]));
    }
  }
}

template <class T, class I>
__global__ void __launch_bounds__(kThreads)
    copy_lines_kernel(Iter it, int64_t len, int64_t dst_step, int64_t index_step, int64_t src_step, int64_t dst_bound) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nthreads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t line = tid; line < it.numel; line += nthreads) {
    int64_t off[3];
    offsets_of<3>(it, line, off);
    T* dst = static_cast<T*>(it.data[0]) + off[0];
    const I* index = static_cast<const I*>(it.data[1]) + off[1];
    const T* src = static_cast<const T*>(it.data[2]) + off[2];
    for (int64_t j = 0; j < len; ++j) {
      const int64_t v = static_cast<int64_t>(index[j * index_step]);
      if (v >= 0 && v < dst_bound) dst[v * dst_step] = src[j * src_step];  // out of range: reported by the check
    }
  }
}

}  // namespace

void launch_gather(const Iter& it, int elem_size, int index_dtype, int64_t x_step, int64_t x_bound,
                   cudaStream_t stream) {
  if (it.numel == 0) return;
  visit_size(elem_size, [&]<class T>() {
    visit_index(index_dtype, [&]<class I>() {
      gather_kernel<T, I><<<it.grid, kThreads, 0, stream>>>(it, x_step, x_bound);
      CPF_CUDA_CHECK_LAUNCH("gather kernel");
    });
  });
}

void launch_scatter_lines(const Iter& it, int acc_dtype, int src_dtype, int index_dtype, int64_t len, int64_t acc_step,
                          int64_t index_step, int64_t src_step, int64_t acc_bound, cudaStream_t stream) {
  if (it.numel == 0 || len == 0) return;
  // One thread per line: launch enough blocks for every line (lines are few compared with elements).
  const int64_t blocks = (it.numel + kThreads - 1) / kThreads;
  const unsigned grid = static_cast<unsigned>(blocks < 65535 * 64 ? blocks : 65535 * 64);
  visit_index(index_dtype, [&]<class I>() {
    const auto go = [&]<class A, class S>() {
      scatter_lines_kernel<A, S, I><<<grid, kThreads, 0, stream>>>(it, len, acc_step, index_step, src_step, acc_bound);
    };
    if (src_dtype == kBF16) {
      go.template operator()<float, bf16>();
    } else {
      switch (acc_dtype) {
        case kF32: go.template operator()<float, float>(); break;
        case kF64: go.template operator()<double, double>(); break;
        case kI32: go.template operator()<int32_t, int32_t>(); break;
        default: go.template operator()<int64_t, int64_t>(); break;  // kI64 (the caller rejects bool)
      }
    }
    CPF_CUDA_CHECK_LAUNCH("scatter kernel");
  });
}

void launch_copy_lines(const Iter& it, int elem_size, int index_dtype, int64_t len, int64_t dst_step,
                       int64_t index_step, int64_t src_step, int64_t dst_bound, cudaStream_t stream) {
  if (it.numel == 0 || len == 0) return;
  const int64_t blocks = (it.numel + kThreads - 1) / kThreads;  // one thread per line
  const unsigned grid = static_cast<unsigned>(blocks < 65535 * 64 ? blocks : 65535 * 64);
  visit_size(elem_size, [&]<class T>() {
    visit_index(index_dtype, [&]<class I>() {
      copy_lines_kernel<T, I><<<grid, kThreads, 0, stream>>>(it, len, dst_step, index_step, src_step, dst_bound);
      CPF_CUDA_CHECK_LAUNCH("index_copy kernel");
    });
  });
}

}  // namespace cpf::cuda::kernels
