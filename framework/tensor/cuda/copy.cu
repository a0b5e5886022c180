// Copies with dtype conversion, and fills.
#include "framework/tensor/cuda/elementwise.cuh"

namespace cpf::cuda::kernels {
namespace {

template <class T>
struct Identity {
  __device__ T operator()(T x) const { return x; }
};

struct F32ToBF16 {
  __device__ bf16 operator()(float x) const { return to_bf16(x); }
};

struct BF16ToF32 {
  __device__ float operator()(bf16 x) const { return to_float(x); }
};

template <class T>
struct Constant {
  T value;
  __device__ T operator()() const { return value; }
};

// The CPU's conversion rules (framework/tensor/ops/copy.cpp): to bool is "non-zero in the source
// type"; bf16 goes through f32; everything else is a static_cast.
template <class Out, class In>
__device__ __forceinline__ Out convert(In x) {
  if constexpr (std::is_same_v<Out, bool>) {
    if constexpr (std::is_same_v<In, bf16>) {
      return to_float(x) != 0.0f;
    } else {
      return x != In(0);
    }
  } else if constexpr (std::is_same_v<In, bf16>) {
    if constexpr (std::is_same_v<Out, bf16>) {
      return x;
    } else {
      return static_cast<Out>(to_float(x));
    }
  } else if constexpr (std::is_same_v<Out, bf16>) {
    return to_bf16(static_cast<float>(x));
  } else {
    return static_cast<Out>(x);
  }
}

template <class Out>
__device__ __forceinline__ Out convert_from(const char* p, int dtype) {
  switch (dtype) {
    case kF32: return convert<Out>(*reinterpret_cast<const float*>(p));
    case kF64: return convert<Out>(*reinterpret_cast<const double*>(p));
    case kBF16: return convert<Out>(*reinterpret_cast<const bf16*>(p));
    case kI32: return convert<Out>(*reinterpret_cast<const int32_t*>(p));
    case kI64: return convert<Out>(*reinterpret_cast<const int64_t*>(p));
    default: return convert<Out>(*reinterpret_cast<const bool*>(p));
  }
}

__device__ __forceinline__ int size_of(int dtype) {
  switch (dtype) {
    case kF32:
    case kI32: return 4;
    case kF64:
    case kI64: return 8;
    case kBF16: return 2;
    default: return 1;
  }
}

// Any pair of dtypes, any strides: the rare conversions (the common ones have their own kernels).
__global__ void __launch_bounds__(kThreads) convert_kernel(Iter it) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nthreads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int out_size = size_of(it.dtype[0]);
  const int in_size = size_of(it.dtype[1]);
  for (int64_t i = tid; i < it.numel; i += nthreads) {
    int64_t off[2];
    offsets_of<2>(it, i, off);
    char* o = static_cast<char*>(it.data[0]) + off[0] * out_size;
    const char* p = static_cast<const char*>(it.data[1]) + off[1] * in_size;
    switch (it.dtype[0]) {
      case kF32: *reinterpret_cast<float*>(o) = convert_from<float>(p, it.dtype[1]); break;
      case kF64: *reinterpret_cast<double*>(o) = convert_from<double>(p, it.dtype[1]); break;
      case kBF16: *reinterpret_cast<bf16*>(o) = convert_from<bf16>(p, it.dtype[1]); break;
      case kI32: *reinterpret_cast<int32_t*>(o) = convert_from<int32_t>(p, it.dtype[1]); break;
      case kI64: *reinterpret_cast<int64_t*>(o) = convert_from<int64_t>(p, it.dtype[1]); break;
      default: *reinterpret_cast<bool*>(o) = convert_from<bool>(p, it.dtype[1]); break;
    }
  }
}

template <class Bits>
void copy_bits(const Iter& it, cudaStream_t stream) {
  launch<Bits, Bits>(it, Identity<Bits>{}, stream, "copy kernel");
}

}  // namespace

void launch_copy(const Iter& it, cudaStream_t stream) {
  if (it.numel == 0) return;
  const int out = it.dtype[0], in = it.dtype[1];
  if (out == in) {
    switch (out) {
      case kF32:
      case kI32: copy_bits<uint32_t>(it, stream); return;
      case kF64:
      case kI64: copy_bits<uint64_t>(it, stream); return;
      case kBF16: copy_bits<uint16_t>(it, stream); return;
      default: copy_bits<uint8_t>(it, stream); return;
    }
  }
  if (out == kBF16 && in == kF32) return launch<bf16, float>(it, F32ToBF16{}, stream, "copy kernel (f32 -> bf16)");
  if (out == kF32 && in == kBF16) return launch<float, bf16>(it, BF16ToF32{}, stream, "copy kernel (bf16 -> f32)");
  convert_kernel<<<it.grid, kThreads, 0, stream>>>(it);
  CPF_CUDA_CHECK_LAUNCH("convert kernel");
}

void launch_fill(const Iter& it, double value, cudaStream_t stream) {
  if (it.numel == 0) return;
  // The value is converted on the host exactly as the CPU's fill_ does, then stored as raw bits.
  switch (it.dtype[0]) {
    case kF32: return launch<float>(it, Constant<float>{static_cast<float>(value)}, stream, "fill kernel");
    case kF64: return launch<double>(it, Constant<double>{value}, stream, "fill kernel");
    case kBF16: {
      // Round to nearest even like cpf::bfloat16 (NaN stays NaN).
      const float f = static_cast<float>(value);
      uint32_t w;
      static_assert(sizeof(w) == sizeof(f));
      __builtin_memcpy(&w, &f, sizeof(w));
      uint16_t bits;
      if ((w & 0x7f800000u) == 0x7f800000u && (w & 0x007fffffu) != 0) {
        bits = static_cast<uint16_t>((w >> 16) | 0x40u);
      } else {
        bits = static_cast<uint16_t>((w + 0x7fffu + ((w >> 16) & 1u)) >> 16);
      }
      return launch<uint16_t>(it, Constant<uint16_t>{bits}, stream, "fill kernel");
    }
    case kI32: return launch<int32_t>(it, Constant<int32_t>{static_cast<int32_t>(value)}, stream, "fill kernel");
    case kI64: return launch<int64_t>(it, Constant<int64_t>{static_cast<int64_t>(value)}, stream, "fill kernel");
    default: return launch<bool>(it, Constant<bool>{static_cast<bool>(value)}, stream, "fill kernel");
  }
}

}  // namespace cpf::cuda::kernels
