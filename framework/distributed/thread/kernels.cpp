#include "framework/distributed/thread/kernels.h"

#include "framework/tensor/device_stream.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "framework/tensor/cpu/strided_loop.h"
#include "framework/tensor/ops/copy.h"

namespace cpf::dist::thread {
namespace {

// bf16 accumulates in f32; every other type in itself.
template <class T>
struct Acc {
  using type = T;
};
template <>
struct Acc<bfloat16> {
  using type = float;
};

template <class A>
A add(A a, A b) {
  if constexpr (std::is_integral_v<A> && !std::is_same_v<A, bool>) {
    // Two's-complement wrap-around, as NCCL does, instead of signed-overflow UB.
    using U = std::make_unsigned_t<A>;
    return static_cast<A>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}

template <class A>
bool is_nan(A a) {
  if constexpr (std::is_floating_point_v<A>) {
    return std::isnan(a);
  } else {
    return false;
  }
}

// NaN wins in max/min, so a NaN on any rank shows up on every rank.
struct SumOp {
  template <class A>
  A operator()(A a, A b) const {
    return add(a, b);
  }
};
struct MaxOp {
  template <class A>
  A operator()(A a, A b) const {
    return (a >= b || is_nan(a)) ? a : b;
  }
};
struct MinOp {
  template <class A>
  A operator()(A a, A b) const {
    return (a <= b || is_nan(a)) ? a : b;
  }
};

// Above this many elements a rank's share is split across its OpenMP threads.
constexpr int64_t kParallelElements = int64_t{1} << 18;

template <class T, class Op>
void reduce_typed(const std::vector<const void*>& inputs, const std::vector<void*>& outputs, int64_t count, Op op,
                  bool average) {
  using A = typename Acc<T>::type;
  // Blocks small enough that the accumulator stays in L1 while every input streams through it.
  constexpr int64_t kBlock = 2048;
  const size_t n = inputs.size();
  const int64_t blocks = (count + kBlock - 1) / kBlock;
  const auto run_block = [&](int64_t b) {
    A acc[kBlock];
    const int64_t start = b * kBlock;
    const int64_t len = std::min(kBlock, count - start);
    const T* first = static_cast<const T*>(inputs[0]) + start;
    for (int64_t i = 0; i < len; ++i) acc[i] = static_cast<A>(first[i]);
    for (size_t s = 1; s < n; ++s) {
      const T* in = static_cast<const T*>(inputs[s]) + start;
      for (int64_t i = 0; i < len; ++i) acc[i] = op(acc[i], static_cast<A>(in[i]));
    }
    if constexpr (std::is_floating_point_v<A>) {
      if (average) {
        const A divisor = static_cast<A>(n);
        for (int64_t i = 0; i < len; ++i) acc[i] /= divisor;
      }
    }
    for (void* out_ptr : outputs) {
      T* out = static_cast<T*>(out_ptr) + start;
      for (int64_t i = 0; i < len; ++i) out[i] = static_cast<T>(acc[i]);
    }
  };
#if defined(CPF_WITH_OPENMP)
  if (count >= kParallelElements && cpu::max_threads() > 1) {
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) run_block(b);
    return;
  }
#endif
  for (int64_t b = 0; b < blocks; ++b) run_block(b);
}

void parallel_memcpy(void* dst, const void* src, size_t bytes) {
#if defined(CPF_WITH_OPENMP)
  constexpr size_t kChunk = size_t{1} << 20;
  const int64_t chunks = static_cast<int64_t>((bytes + kChunk - 1) / kChunk);
  if (chunks > 1 && cpu::max_threads() > 1) {
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      const size_t begin = static_cast<size_t>(c) * kChunk;
      std::memcpy(static_cast<char*>(dst) + begin, static_cast<const char*>(src) + begin,
                  std::min(kChunk, bytes - begin));
    }
    return;
  }
#endif
  std::memcpy(dst, src, bytes);
}

}  // namespace

bool shares_storage(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.storage() && a.storage() == b.storage();
}

bool same_view(const Tensor& a, const Tensor& b) {
  return shares_storage(a, b) && a.offset() == b.offset() && a.shape() == b.shape() && a.strides() == b.strides();
}

void copy_view(const Tensor& dst, const Tensor& src) {
  CPF_CHECK(dst.shape() == src.shape() && dst.dtype() == src.dtype(), "copy_view: dst ", dst.shape(), " ", dst.dtype(),
            " vs src ", src.shape(), " ", src.dtype());
  if (dst.numel() == 0) return;
  if (dst.is_contiguous() && src.is_contiguous()) {
    parallel_memcpy(dst.raw_data(), src.raw_data(), static_cast<size_t>(dst.numel()) * dtype_size(dst.dtype()));
    return;
  }
  visit_dtype(dst.dtype(), [&]<class T>() {
    cpu::map_elements<T, T>(
        dst, [](T x) { return x; }, src);
  });
}

void reduce_into(ReduceOp op, DType dtype, const std::vector<const void*>& inputs, const std::vector<void*>& outputs,
                 int64_t count) {
  if (count <= 0 || inputs.empty()) return;
  visit_dtype(dtype, [&]<class T>() {
    switch (op) {
      case ReduceOp::sum: reduce_typed<T>(inputs, outputs, count, SumOp{}, false); break;
      case ReduceOp::avg: reduce_typed<T>(inputs, outputs, count, SumOp{}, true); break;
      case ReduceOp::max: reduce_typed<T>(inputs, outputs, count, MaxOp{}, false); break;
      case ReduceOp::min: reduce_typed<T>(inputs, outputs, count, MinOp{}, false); break;
    }
  });
}

Tensor host_view(const Tensor& t) { return t.device().is_cpu() ? t : raw::to(t, Device::cpu()); }

void device_written(const Tensor& t) {
  if (!t.device().is_cpu()) DeviceStream::current(t.device()).synchronize();
}

Tensor host_contiguous(const Tensor& t) { return raw::contiguous(host_view(t)); }

}  // namespace cpf::dist::thread
