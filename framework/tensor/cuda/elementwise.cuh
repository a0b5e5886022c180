#pragma once
// Device-side element-wise machinery shared by the .cu files (nvcc only): the bf16 storage type,
// the linear (optionally vectorised) and strided grid-stride kernels, and their launch.
//
// A functor F maps input elements to the output element: Out f(In...) on storage types; bf16 math
// happens in f32 inside the functor, rounded once on output.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "framework/tensor/cuda/cuda_check.cuh"
#include "framework/tensor/cuda/kernels.cuh"

namespace cpf::cuda::kernels {

// bfloat16 storage: the top 16 bits of an IEEE float (same bits as cpf::bfloat16).
struct bf16 {
  uint16_t bits;
};

__device__ __forceinline__ float to_float(bf16 v) { return __uint_as_float(static_cast<uint32_t>(v.bits) << 16); }

// Round to nearest even; NaN stays a (quiet) NaN with its sign and top payload bits. Bit-identical to
// cpf::bfloat16::round_from_float: the hardware conversion (cvt.rn.bf16.f32, one instruction on sm_80+)
// rounds finite values and infinities the same way but returns a canonical NaN, so NaN keeps the
// integer path. The integer rounding of every element (6 integer ops) kept bf16 kernels compute-bound.
__device__ __forceinline__ bf16 to_bf16(float f) {
  const uint32_t w = __float_as_uint(f);
  if (f != f) return bf16{static_cast<uint16_t>((w >> 16) | 0x40u)};
  return bf16{__bfloat16_as_ushort(__float2bfloat16_rn(f))};
}

// The type a storage type computes in.
template <class T>
struct compute_type {
  using type = T;
};
template <>
struct compute_type<bf16> {
  using type = float;
};
template <class T>
using compute_t = typename compute_type<T>::type;

template <class T>
__device__ __forceinline__ compute_t<T> widen(T v) {
  if constexpr (std::is_same_v<T, bf16>) {
    return to_float(v);
  } else {
    return v;
  }
}

template <class T>
__device__ __forceinline__ T narrow(compute_t<T> v) {
  if constexpr (std::is_same_v<T, bf16>) {
    return to_bf16(v);
  } else {
    return v;
  }
}

template <class T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

template <class... T>
inline constexpr int max_size_of() {
  int m = 1;
  ((m = static_cast<int>(sizeof(T)) > m ? static_cast<int>(sizeof(T)) : m), ...);
  return m;
}

template <class T, int V>
__device__ __forceinline__ Vec<T, V> load_vec(const void* base, int64_t stride, int64_t i0) {
  const T* p = static_cast<const T*>(base);
  if (stride == 0) {
    Vec<T, V> x;
    const T s = *p;
#pragma unroll
    for (int j = 0; j < V; ++j) x.v[j] = s;
    return x;
  }
  return *reinterpret_cast<const Vec<T, V>*>(p + i0);
}

template <int V, class Out, class F, class... In>
__device__ __forceinline__ Vec<Out, V> apply_vec(const F& f, const Vec<In, V>&... xs) {
  Vec<Out, V> o;
#pragma unroll
  for (int j = 0; j < V; ++j) o.v[j] = f(xs.v[j]...);
  return o;
}

// ndim == 1, every stride 0 or 1.
template <class F, class Out, class... In, size_t... K>
__device__ __forceinline__ void linear_body(const Iter& it, const F& f, std::index_sequence<K...>) {
  constexpr int V = vector_width(max_size_of<Out, In...>());
  const int64_t n = it.numel;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nthreads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  Out* out = static_cast<Out*>(it.data[0]);
  int64_t start = 0;
  if (it.vectorize) {
    const int64_t nv = n / V;
    for (int64_t v = tid; v < nv; v += nthreads) {
      const int64_t i0 = v * V;
      *reinterpret_cast<Vec<Out, V>*>(out + i0) =
          apply_vec<V, Out>(f, load_vec<In, V>(it.data[K + 1], it.strides[K + 1][0], i0)...);
    }
    start = nv * V;
  }
  const int64_t so = it.strides[0][0];
  for (int64_t i = start + tid; i < n; i += nthreads) {
    out[i * so] = f(static_cast<const In*>(it.data[K + 1])[i * it.strides[K + 1][0]]...);
  }
}

template <class F, class Out, class... In>
__global__ void __launch_bounds__(kThreads) linear_kernel(Iter it, F f) {
  linear_body<F, Out, In...>(it, f, std::index_sequence_for<In...>{});
}

__device__ __forceinline__ uint32_t fast_div(const FastDivmod& d, uint32_t n) {
  return (__umulhi(n, d.magic) + n) >> d.shift;
}

// Element offsets of flat position i for every operand (innermost dim last).
template <int N>
__device__ __forceinline__ void offsets_of(const Iter& it, int64_t i, int64_t (&off)[N]) {
#pragma unroll
  for (int k = 0; k < N; ++k) off[k] = 0;
  if (it.index32) {
    uint32_t rest = static_cast<uint32_t>(i);
    for (int d = it.ndim - 1; d >= 0; --d) {
      const uint32_t q = fast_div(it.divs[d], rest);
      const uint32_t c = rest - q * it.divs[d].divisor;
      rest = q;
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] += static_cast<int64_t>(c) * it.strides[k][d];
    }
  } else {
    int64_t rest = i;
    for (int d = it.ndim - 1; d >= 0; --d) {
      const int64_t c = rest % it.sizes[d];
      rest /= it.sizes[d];
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] += c * it.strides[k][d];
    }
  }
}

template <class F, class Out, class... In, size_t... K>
__device__ __forceinline__ void strided_body(const Iter& it, const F& f, std::index_sequence<K...>) {
  constexpr int N = 1 + sizeof...(In);
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nthreads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  Out* out = static_cast<Out*>(it.data[0]);
  if (it.vectorize) {
    // The innermost dim is a multiple of V with strides 0 or 1 and aligned rows (checked on the host):
    // one offset computation and one 16-byte access per operand for V elements.
    constexpr int V = vector_width(max_size_of<Out, In...>());
    const int last = it.ndim - 1;
    for (int64_t v = tid; v < it.numel / V; v += nthreads) {
      int64_t off[N];
      offsets_of<N>(it, v * V, off);
      *reinterpret_cast<Vec<Out, V>*>(out + off[0]) = apply_vec<V, Out>(
          f, load_vec<In, V>(static_cast<const In*>(it.data[K + 1]) + off[K + 1], it.strides[K + 1][last], 0)...);
    }
    return;
  }
  for (int64_t i = tid; i < it.numel; i += nthreads) {
    int64_t off[N];
    offsets_of<N>(it, i, off);
    out[off[0]] = f(static_cast<const In*>(it.data[K + 1])[off[K + 1]]...);
  }
}

template <class F, class Out, class... In>
__global__ void __launch_bounds__(kThreads) strided_kernel(Iter it, F f) {
  strided_body<F, Out, In...>(it, f, std::index_sequence_for<In...>{});
}

// Runs f over the iteration: the linear kernel when the host found the iteration linear.
template <class Out, class... In, class F>
void launch(const Iter& it, const F& f, cudaStream_t stream, const char* what) {
  if (it.numel == 0) return;
  if (it.linear) {
    linear_kernel<F, Out, In...><<<it.grid, kThreads, 0, stream>>>(it, f);
  } else {
    strided_kernel<F, Out, In...><<<it.grid, kThreads, 0, stream>>>(it, f);
  }
  CPF_CUDA_CHECK_LAUNCH(what);
}

// Calls fn.template operator()<T>() with T the storage type of a floating dtype code.
template <class Fn>
void visit_floating(int dtype, Fn&& fn) {
  switch (dtype) {
    case kF32: fn.template operator()<float>(); return;
    case kF64: fn.template operator()<double>(); return;
    case kBF16: fn.template operator()<bf16>(); return;
    default: CPF_FAIL("cuda kernel: dtype code ", dtype, " is not floating");
  }
}

// Calls fn.template operator()<I>() with I the storage type of an index dtype code: int32_t for kI32,
// int64_t otherwise (the ops accept only i32 and i64 indices).
template <class Fn>
void visit_index(int dtype, Fn&& fn) {
  if (dtype == kI32) {
    fn.template operator()<int32_t>();
  } else {
    fn.template operator()<int64_t>();
  }
}

// Same over the arithmetic dtypes (floating, i32, i64).
template <class Fn>
void visit_arithmetic(int dtype, Fn&& fn) {
  switch (dtype) {
    case kI32: fn.template operator()<int32_t>(); return;
    case kI64: fn.template operator()<int64_t>(); return;
    default: visit_floating(dtype, fn);
  }
}

}  // namespace cpf::cuda::kernels
