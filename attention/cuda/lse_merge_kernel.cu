// The CP merge (lse_merge_kernel.cuh): one warp per (token, head) row. Every lane reads the row's two
// lse values, computes the weights of the host loop in attention/cp/lse_merge.cpp (same formulas, in
// the accumulator's type), rescales its strided share of the row's values, and lane 0 writes the new
// lse after the warp has read the old one. The part is read once in its own dtype (bf16 widened in
// registers): no converted copy, no temporary.
#include "attention/cuda/lse_merge_kernel.cuh"
#include "framework/tensor/cuda/elementwise.cuh"

namespace cpf::attention_cuda::merge {
namespace {

using cuda::kernels::bf16;
using cuda::kernels::to_float;

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;

__device__ __forceinline__ float exp_of(float x) { return expf(x); }
__device__ __forceinline__ double exp_of(double x) { return exp(x); }
__device__ __forceinline__ float log_of(float x) { return logf(x); }
__device__ __forceinline__ double log_of(double x) { return log(x); }

template <class A, class P>
__device__ __forceinline__ A value_of(P v) {
  if constexpr (std::is_same_v<P, bf16>) {
    return static_cast<A>(to_float(v));
  } else {
    return static_cast<A>(v);
  }
}

template <class A, class P>
__global__ void __launch_bounds__(kThreads)
    lse_merge_kernel(A* acc_out, A* acc_lse, const P* part_out, const A* part_lse, int64_t tokens, int64_t heads,
                     int64_t dim) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t rows = tokens * heads;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32; row < rows; row += stride) {
    const int64_t t = row / heads, h = row - t * heads;
    const int64_t l = h * tokens + t;  // lse is (H, T)
    const A li = part_lse[l];
    if (isinf(li) && li < 0) continue;  // the part saw no key for the row: the whole warp skips it
    const A la = acc_lse[l];
    const A hi = la > li ? la : li;
    const A merged = hi + log_of(exp_of(la - hi) + exp_of(li - hi));
    const A keep = isinf(la) && la < 0 ? A(0) : exp_of(la - merged);
    const A take = exp_of(li - merged);
    A* out = acc_out + row * dim;
    const P* part = part_out + row * dim;
    for (int64_t d = lane; d < dim; d += 32) out[d] = keep * out[d] + take * value_of<A>(part[d]);
    __syncwarp();  // every lane has read la before it changes
    if (lane == 0) acc_lse[l] = merged;
  }
}

template <class A, class P>
void launch(void* acc_out, void* acc_lse, const void* part_out, const void* part_lse, int64_t tokens, int64_t heads,
            int64_t dim, cudaStream_t stream) {
  const int64_t rows = tokens * heads;
  const int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const unsigned grid = static_cast<unsigned>(blocks < 65535 * 32 ? blocks : 65535 * 32);
  lse_merge_kernel<A, P><<<grid, kThreads, 0, stream>>>(static_cast<A*>(acc_out), static_cast<A*>(acc_lse),
                                                        static_cast<const P*>(part_out),
                                                        static_cast<const A*>(part_lse), tokens, heads, dim);
  CPF_CUDA_CHECK_LAUNCH("cp lse merge kernel");
}

template <class A, class P>
__global__ void __launch_bounds__(kThreads) accumulate_kernel(A* acc, const P* part, int64_t count) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < count; i += stride) {
    acc[i] += value_of<A>(part[i]);
  }
}

template <class A, class P>
void launch_add(void* acc, const void* part, int64_t count, cudaStream_t stream) {
  const int64_t blocks = (count + kThreads - 1) / kThreads;
  const unsigned grid = static_cast<unsigned>(blocks < 65535 * 32 ? blocks : 65535 * 32);
  accumulate_kernel<A, P><<<grid, kThreads, 0, stream>>>(static_cast<A*>(acc), static_cast<const P*>(part), count);
  CPF_CUDA_CHECK_LAUNCH("cp accumulate kernel");
}

}  // namespace

void launch_lse_merge(int acc_dtype, int part_dtype, void* acc_out, void* acc_lse, const void* part_out,
                      const void* part_lse, int64_t tokens, int64_t heads, int64_t dim, cudaStream_t stream) {
  if (tokens * heads == 0) return;
  auto with_part = [&]<class A>() {
    switch (part_dtype) {
      case 0: return launch<A, float>(acc_out, acc_lse, part_out, part_lse, tokens, heads, dim, stream);
      case 1: return launch<A, double>(acc_out, acc_lse, part_out, part_lse, tokens, heads, dim, stream);
      default: return launch<A, bf16>(acc_out, acc_lse, part_out, part_lse, tokens, heads, dim, stream);
    }
  };
  if (acc_dtype == 1) {
    with_part.template operator()<double>();
  } else {
    with_part.template operator()<float>();
  }
}

}  // namespace cpf::attention_cuda::merge

namespace cpf::attention_cuda::merge {

void launch_accumulate(int acc_dtype, int part_dtype, void* acc, const void* part, int64_t count, cudaStream_t stream) {
  if (count == 0) return;
  auto with_part = [&]<class A>() {
    switch (part_dtype) {
      case 0: return launch_add<A, float>(acc, part, count, stream);
      case 1: return launch_add<A, double>(acc, part, count, stream);
      default: return launch_add<A, bf16>(acc, part, count, stream);
    }
  };
  if (acc_dtype == 1) {
    with_part.template operator()<double>();
  } else {
    with_part.template operator()<float>();
  }
}

}  // namespace cpf::attention_cuda::merge
