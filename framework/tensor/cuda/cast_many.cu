// Many f32 -> bf16 conversions in one launch (raw::to_many): the per-step bf16 copies of a model's
// master weights. A launch per parameter was ~150 launches per step for GPT-2 124M, most of them too
// small to fill the GPU; here the list travels in the kernel's parameters (up to kCastItems pairs per
// launch) and blocks walk fixed chunks of the concatenated elements. Rounding is the copy kernel's
// to_bf16 (nearest even, NaN kept quiet), so values equal raw::to's.
#include "framework/tensor/cuda/elementwise.cuh"

namespace cpf::cuda::kernels {
namespace {

constexpr int kCastItems = 64;        // pairs per launch: 64 * 32 bytes stay under the 4 KB parameter limit
constexpr int64_t kCastChunk = 4096;  // elements per block iteration: 256 threads x 16

struct CastList {
  const float* src[kCastItems];
  bf16* dst[kCastItems];
  int64_t n[kCastItems];
  int64_t first_chunk[kCastItems + 1];  // prefix sums of each pair's chunk count
  int count;
};

__global__ void __launch_bounds__(kThreads) cast_many_kernel(const __grid_constant__ CastList list) {
  const int64_t chunks = list.first_chunk[list.count];
  for (int64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    int item = 0;  // the pair holding chunk c: binary search over the prefix sums
    int lo = 0, hi = list.count - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (list.first_chunk[mid] <= c)
        lo = mid;
      else
        hi = mid - 1;
    }
    item = lo;
    const int64_t begin = (c - list.first_chunk[item]) * kCastChunk;
    const int64_t end = begin + kCastChunk < list.n[item] ? begin + kCastChunk : list.n[item];
    const float* src = list.src[item];
    bf16* dst = list.dst[item];
    // 4-wide when the pair's bases allow (16-byte f32 loads, 8-byte bf16 stores); chunks start at
    // multiples of kCastChunk, so alignment holds for every chunk of an aligned pair.
    const bool vec = reinterpret_cast<uintptr_t>(src) % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 8 == 0;
    if (vec) {
      const int64_t vend = begin + (end - begin) / 4 * 4;
      for (int64_t i = begin + 4 * static_cast<int64_t>(threadIdx.x); i < vend; i += 4 * kThreads) {
        const Vec<float, 4> v = *reinterpret_cast<const Vec<float, 4>*>(src + i);
        Vec<bf16, 4> o;
#pragma unroll
        for (int k = 0; k < 4; ++k) o.v[k] = to_bf16(v.v[k]);
        *reinterpret_cast<Vec<bf16, 4>*>(dst + i) = o;
      }
      for (int64_t i = vend + threadIdx.x; i < end; i += kThreads) dst[i] = to_bf16(src[i]);
    } else {
      for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) dst[i] = to_bf16(src[i]);
    }
  }
}

}  // namespace

void launch_cast_f32_bf16_many(const void* const* src, void* const* dst, const int64_t* n, int count, int sm_count,
                               cudaStream_t stream) {
  for (int first = 0; first < count; first += kCastItems) {
    CastList list{};
    list.count = count - first < kCastItems ? count - first : kCastItems;
    list.first_chunk[0] = 0;
    for (int i = 0; i < list.count; ++i) {
      list.src[i] = static_cast<const float*>(src[first + i]);
      list.dst[i] = static_cast<bf16*>(dst[first + i]);
      list.n[i] = n[first + i];
      list.first_chunk[i + 1] = list.first_chunk[i] + (list.n[i] + kCastChunk - 1) / kCastChunk;
    }
    const int64_t chunks = list.first_chunk[list.count];
    if (chunks == 0) continue;
    const int64_t cap = 8 * static_cast<int64_t>(sm_count > 0 ? sm_count : 1);  // grid-stride beyond that
    cast_many_kernel<<<static_cast<unsigned>(chunks < cap ? chunks : cap), kThreads, 0, stream>>>(list);
    CPF_CUDA_CHECK_LAUNCH("cast_many kernel");
  }
}

}  // namespace cpf::cuda::kernels
