// FP8 casts (fp8_kernels.cuh): grid-stride loops over contiguous data (16-byte vectors where aligned), tiles for
// the transposing cast (fp8_tiles.cuh, shared with fp8_rows.cu); the amax is fp8_tiles.cuh's block_amax.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "framework/tensor/cuda/activation_math.cuh"
#include "framework/tensor/cuda/cuda_check.cuh"
#include "framework/tensor/cuda/elementwise.cuh"
#include "framework/tensor/cuda/fp8_kernels.cuh"
#include "framework/tensor/cuda/fp8_tiles.cuh"
#include "framework/tensor/cuda/kernels.cuh"

namespace cpf::cuda::kernels {
namespace {

using namespace fp8_tiles;  // kFp8Threads, kTile, load_float, abs_bits, block_amax, PlainLoad, cast_tile

template <class In>
__global__ void amax_kernel(const In* x, int64_t n, float* amax) {
  unsigned m = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    m = max(m, abs_bits(load_float(x, i)));
  }
  block_amax(m, amax, threadIdx.x);
}

// amax over 16-byte vectors (f32 and bf16 data aligned to 16 bytes), the tail past the last whole vector
// element by element: one scalar load a thread moved a sixth of what the memory could.
template <class In>
__global__ void amax_vector_kernel(const In* x, int64_t n, float* amax) {
  constexpr int V = 16 / sizeof(In);
  const int64_t vectors = n / V, stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  unsigned m = 0;
  for (int64_t i = first; i < vectors; i += stride) {
    const uint4 raw = reinterpret_cast<const uint4*>(x)[i];
    const In* e = reinterpret_cast<const In*>(&raw);
#pragma unroll
    for (int k = 0; k < V; ++k) m = max(m, abs_bits(load_float(e, k)));
  }
  for (int64_t i = vectors * V + first; i < n; i += stride) m = max(m, abs_bits(load_float(x, i)));
  block_amax(m, amax, threadIdx.x);
}

template <class In>
__global__ void quantize_kernel(const In* x, int64_t n, const float* scale, __nv_fp8_interpretation_t kind, uint8_t* q,
                                float* amax) {
  const float s = *scale;
  unsigned m = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = load_float(x, i);
    m = max(m, abs_bits(v));
    q[i] = __nv_cvt_float_to_fp8(__fmul_rn(v, s), __NV_SATFINITE, kind);  // one rounded f32 product
  }
  if (amax != nullptr) block_amax(m, amax, threadIdx.x);
}

// x (rows, cols) -> q (rows, cols) (or null) and qt (cols, rows) in one pass: a 32 x 32 tile per block,
// cast once, written row-wise to q and through shared memory column-wise to qt (both coalesced).
template <class In>
__global__ void quantize_transpose_kernel(const In* x, int64_t rows, int64_t cols, const float* scale,
                                          __nv_fp8_interpretation_t kind, uint8_t* q, uint8_t* qt, float* amax) {
  __shared__ uint8_t tile[32][33];
  const float s = *scale;
  const int64_t r0 = int64_t(blockIdx.y) * 32, c0 = int64_t(blockIdx.x) * 32;
  unsigned m = 0;
  for (int i = threadIdx.y; i < 32; i += 8) {
    const int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < rows && c < cols) {
      const float v = load_float(x, r * cols + c);
      m = max(m, abs_bits(v));
      const uint8_t b = __nv_cvt_float_to_fp8(__fmul_rn(v, s), __NV_SATFINITE, kind);
      if (q != nullptr) q[r * cols + c] = b;
      tile[i][threadIdx.x] = b;
    }
  }
  __syncthreads();
  for (int i = threadIdx.y; i < 32; i += 8) {
    const int64_t c = c0 + i, r = r0 + threadIdx.x;
    if (r < rows && c < cols) qt[c * rows + r] = tile[threadIdx.x][i];
  }
  if (amax != nullptr) block_amax(m, amax, threadIdx.y * 32 + threadIdx.x);
}

// Activation loaders (as fp8_tiles.cuh's PlainLoad): h computed from the activation's input, rounded to bf16
// as the element-wise kernels write it (unary.cu, swiglu.cu; the formulas are activation_math.cuh's), so a
// fused cast gives the codes of the activation's output cast by PlainLoad.
using Bf16Vector = Vec<bf16, 8>;

struct GeluLoad {  // h = gelu(pre), pre (rows, cols) bf16
  static constexpr int V = 8;
  const bf16* pre;
  int64_t cols;
  __device__ __forceinline__ void operator()(int64_t r, int64_t c, float* f) const {
    const Bf16Vector p = *reinterpret_cast<const Bf16Vector*>(pre + r * cols + c);
#pragma unroll
    for (int k = 0; k < V; ++k) f[k] = widen(narrow<bf16>(gelu_tanh(widen(p.v[k]))));
  }
};

struct SwigluLoad {  // h = silu(gate) * up, pre (rows, 2 cols) = [gate | up] bf16
  static constexpr int V = 8;
  const bf16* pre;
  int64_t cols;
  __device__ __forceinline__ void operator()(int64_t r, int64_t c, float* f) const {
    const Bf16Vector g = *reinterpret_cast<const Bf16Vector*>(pre + r * 2 * cols + c);
    const Bf16Vector u = *reinterpret_cast<const Bf16Vector*>(pre + r * 2 * cols + cols + c);
#pragma unroll
    for (int k = 0; k < V; ++k) f[k] = widen(narrow<bf16>(swiglu_value(widen(g.v[k]), widen(u.v[k]))));
  }
};

// The amax of the loaded tensor (rows, load.cols), cols a multiple of Load::V: a vector a thread per step.
template <class Load>
__global__ void amax_loaded_kernel(Load load, int64_t rows, float* amax) {
  constexpr int V = Load::V;
  const int64_t per_row = load.cols / V, vectors = rows * per_row, stride = int64_t(gridDim.x) * blockDim.x;
  unsigned m = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < vectors; i += stride) {
    float f[V];
    load(i / per_row, (i % per_row) * V, f);
#pragma unroll
    for (int k = 0; k < V; ++k) m = max(m, abs_bits(f[k]));
  }
  block_amax(m, amax, threadIdx.x);
}

// The same cast over 64 x 64 tiles when rows and cols are multiples of 64 and the data 16-byte aligned: x
// read in 16-byte vectors, q written 4 or 8 bytes a thread, qt 8 bytes a thread from the tile in shared
// memory. The 32 x 32 kernel above moves one element a thread and ran at a sixth of the memory's rate on
// an H100 (164 us for 8192 x 2048 bf16, 2026-12-07). The values are the same: one rounded product each.
// partials (or null): (rows / 64, cols) f32, each tile row's column sums (column_sums_kernel adds them up).
template <class Load>
__global__ void __launch_bounds__(kFp8Threads)
    quantize_transpose_tiles_kernel(Load load, int64_t rows, const float* scale, __nv_fp8_interpretation_t kind,
                                    uint8_t* q, uint8_t* qt, float* amax, float* partials) {
  float* tile_row_sums = partials == nullptr ? nullptr : partials + int64_t(blockIdx.y) * load.cols;
  const unsigned m = cast_tile(load, int64_t(blockIdx.y) * kTile, int64_t(blockIdx.x) * kTile, rows, *scale, kind, q,
                               qt, tile_row_sums);
  if (amax != nullptr) block_amax(m, amax, threadIdx.x);
}

// partials (ceil(rows / 64), cols) f32 = the sums of each 64-row block of x (rows, cols): the column sums of
// the shapes the tile kernel does not take (a thread a column, a block row per 64 rows).
template <class In>
__global__ void column_partials_kernel(const In* x, int64_t rows, int64_t cols, float* partials) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, r0 = int64_t(blockIdx.y) * kTile;
  if (c >= cols) return;
  float sum = 0.0f;
  for (int64_t r = r0; r < rows && r < r0 + kTile; ++r) sum += load_float(x, r * cols + c);
  partials[int64_t(blockIdx.y) * cols + c] = sum;
}

// out (cols) f32 = the sums of partials (blocks, cols) over its rows, in row order (deterministic).
__global__ void column_sums_kernel(const float* partials, int64_t blocks, int64_t cols, float* out) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  float sum = 0.0f;
  for (int64_t b = 0; b < blocks; ++b) sum += partials[b * cols + c];
  out[c] = sum;
}

template <class Out>
__device__ __forceinline__ void store(Out* out, int64_t i, float v);
template <>
__device__ __forceinline__ void store(float* out, int64_t i, float v) {
  out[i] = v;
}
template <>
__device__ __forceinline__ void store(__nv_bfloat16* out, int64_t i, float v) {
  out[i] = __float2bfloat16_rn(v);
}

template <class Out>
__global__ void dequantize_kernel(const uint8_t* q, int64_t n, const float* scale_inv, __nv_fp8_interpretation_t kind,
                                  Out* out) {
  const float s = *scale_inv;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = __half2float(__half(__nv_cvt_fp8_to_halfraw(q[i], kind)));
    store(out, i, __fmul_rn(v, s));
  }
}

__global__ void scale_kernel(const float* amax, double fp8_max, int64_t margin, const float* fallback, float* out) {
  const float a = *amax;
  const bool usable = isfinite(a) && a > 0.0f;
  // As the CPU computes it: the quotient in double, then one rounding to f32.
  *out = usable ? static_cast<float>(fp8_max / static_cast<double>(a) / ldexp(1.0, static_cast<int>(margin)))
                : (fallback != nullptr ? *fallback : 1.0f);
}

int blocks_for(int64_t n, int sm_count) {
  const int64_t wanted = (n + kFp8Threads - 1) / kFp8Threads;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(wanted, int64_t(sm_count) * 8)));
}

__nv_fp8_interpretation_t kind_of(bool e4m3) { return e4m3 ? __NV_E4M3 : __NV_E5M2; }

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

void launch_fp8_amax(int dtype, const void* x, int64_t n, float* amax, int sm_count, cudaStream_t stream) {
  const int blocks = blocks_for(n, sm_count);
  if (aligned16(x) && (dtype == kF32 || dtype == kBF16)) {
    const int vector_blocks = blocks_for(n / (dtype == kF32 ? 4 : 8) + 1, sm_count);
    if (dtype == kF32) {
      amax_vector_kernel<<<vector_blocks, kFp8Threads, 0, stream>>>(static_cast<const float*>(x), n, amax);
    } else {
      amax_vector_kernel<<<vector_blocks, kFp8Threads, 0, stream>>>(static_cast<const __nv_bfloat16*>(x), n, amax);
    }
  } else if (dtype == kF32) {
    amax_kernel<<<blocks, kFp8Threads, 0, stream>>>(static_cast<const float*>(x), n, amax);
  } else if (dtype == kBF16) {
    amax_kernel<<<blocks, kFp8Threads, 0, stream>>>(static_cast<const __nv_bfloat16*>(x), n, amax);
  } else {
    amax_kernel<<<blocks, kFp8Threads, 0, stream>>>(static_cast<const double*>(x), n, amax);
  }
  CPF_CUDA_CHECK(cudaGetLastError());
}

void launch_quantize_fp8(int dtype, bool fp8_e4m3, const void* x, int64_t n, const float* scale, uint8_t* q,
                         float* amax, int sm_count, cudaStream_t stream) {
  const int blocks = blocks_for(n, sm_count);
  if (dtype == kF32) {
    quantize_kernel<<<blocks, kFp8Threads, 0, stream>>>(static_cast<const float*>(x), n, scale, kind_of(fp8_e4m3), q,
                                                        amax);
  } else {
    quantize_kernel<<<blocks, kFp8Threads, 0, stream>>>(static_cast<const __nv_bfloat16*>(x), n, scale,
                                                        kind_of(fp8_e4m3), q, amax);
  }
  CPF_CUDA_CHECK(cudaGetLastError());
}

int64_t column_sum_blocks(int64_t rows) { return (rows + kTile - 1) / kTile; }

void launch_quantize_fp8_transposed(int dtype, bool fp8_e4m3, const void* x, int64_t rows, int64_t cols,
                                    const float* scale, uint8_t* q, uint8_t* qt, float* amax, cudaStream_t stream,
                                    float* partials, float* column_sums) {
  const auto aligned8 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 8 == 0; };  // null: aligned
  const bool sums = column_sums != nullptr;
  if (rows % kTile == 0 && cols % kTile == 0 && rows / kTile <= 65535 && aligned16(x) && aligned8(q) && aligned8(qt)) {
    const dim3 tiles(static_cast<unsigned>(cols / kTile), static_cast<unsigned>(rows / kTile));
    float* tile_sums = sums ? partials : nullptr;
    if (dtype == kF32) {
      quantize_transpose_tiles_kernel<<<tiles, kFp8Threads, 0, stream>>>(
          PlainLoad<float>{static_cast<const float*>(x), cols}, rows, scale, kind_of(fp8_e4m3), q, qt, amax, tile_sums);
    } else {
      quantize_transpose_tiles_kernel<<<tiles, kFp8Threads, 0, stream>>>(
          PlainLoad<__nv_bfloat16>{static_cast<const __nv_bfloat16*>(x), cols}, rows, scale, kind_of(fp8_e4m3), q, qt,
          amax, tile_sums);
    }
  } else {
    const dim3 grid(static_cast<unsigned>((cols + 31) / 32), static_cast<unsigned>((rows + 31) / 32));
    const dim3 block(32, 8);
    const dim3 partial_grid(static_cast<unsigned>((cols + 255) / 256), static_cast<unsigned>(column_sum_blocks(rows)));
    if (dtype == kF32) {
      const auto* xf = static_cast<const float*>(x);
      quantize_transpose_kernel<<<grid, block, 0, stream>>>(xf, rows, cols, scale, kind_of(fp8_e4m3), q, qt, amax);
      if (sums) column_partials_kernel<<<partial_grid, 256, 0, stream>>>(xf, rows, cols, partials);
    } else {
      const auto* xb = static_cast<const __nv_bfloat16*>(x);
      quantize_transpose_kernel<<<grid, block, 0, stream>>>(xb, rows, cols, scale, kind_of(fp8_e4m3), q, qt, amax);
      if (sums) column_partials_kernel<<<partial_grid, 256, 0, stream>>>(xb, rows, cols, partials);
    }
  }
  CPF_CUDA_CHECK(cudaGetLastError());
  if (sums) {
    column_sums_kernel<<<static_cast<unsigned>((cols + 255) / 256), 256, 0, stream>>>(partials, column_sum_blocks(rows),
                                                                                      cols, column_sums);
    CPF_CUDA_CHECK(cudaGetLastError());
  }
}

namespace {

// Whether the activation kernels take pre (rows, cols of the activation's output): whole 64 x 64 tiles of
// 16-byte aligned rows.
bool activation_fits(const void* pre, int64_t rows, int64_t cols, const uint8_t* q, const uint8_t* qt) {
  const auto aligned8 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 8 == 0; };  // null: aligned
  return rows > 0 && cols > 0 && rows % kTile == 0 && cols % kTile == 0 && rows / kTile <= 65535 && aligned16(pre) &&
         aligned8(q) && aligned8(qt);
}

// Calls fn(load) with the loader of `activation` over pre; false (nothing called) for a code that is neither
// kFp8Gelu nor kFp8Swiglu.
template <class Fn>
bool with_activation_load(int activation, const void* pre, int64_t cols, Fn&& fn) {
  const auto* p = static_cast<const bf16*>(pre);
  if (activation == kFp8Gelu) {
    fn(GeluLoad{p, cols});
  } else if (activation == kFp8Swiglu) {
    fn(SwigluLoad{p, cols});
  } else {
    return false;
  }
  return true;
}

}  // namespace

bool launch_fp8_activation_amax(int activation, const void* pre, int64_t rows, int64_t cols, float* amax, int sm_count,
                                cudaStream_t stream) {
  if (!activation_fits(pre, rows, cols, nullptr, nullptr)) return false;
  const int blocks = blocks_for(rows * cols / 8, sm_count);
  const bool known = with_activation_load(activation, pre, cols, [&](auto load) {
    amax_loaded_kernel<<<blocks, kFp8Threads, 0, stream>>>(load, rows, amax);
  });
  CPF_CUDA_CHECK(cudaGetLastError());
  return known;
}

bool launch_quantize_fp8_activation(int activation, bool fp8_e4m3, const void* pre, int64_t rows, int64_t cols,
                                    const float* scale, uint8_t* q, uint8_t* qt, float* amax, cudaStream_t stream) {
  if (!activation_fits(pre, rows, cols, q, qt)) return false;
  const dim3 tiles(static_cast<unsigned>(cols / kTile), static_cast<unsigned>(rows / kTile));
  const bool known = with_activation_load(activation, pre, cols, [&](auto load) {
    quantize_transpose_tiles_kernel<<<tiles, kFp8Threads, 0, stream>>>(load, rows, scale, kind_of(fp8_e4m3), q, qt,
                                                                       amax, nullptr);
  });
  CPF_CUDA_CHECK(cudaGetLastError());
  return known;
}

void launch_dequantize_fp8(int dtype, bool fp8_e4m3, const uint8_t* q, int64_t n, const float* scale_inv, void* out,
                           int sm_count, cudaStream_t stream) {
  const int blocks = blocks_for(n, sm_count);
  if (dtype == kF32) {
    dequantize_kernel<<<blocks, kFp8Threads, 0, stream>>>(q, n, scale_inv, kind_of(fp8_e4m3), static_cast<float*>(out));
  } else {
    dequantize_kernel<<<blocks, kFp8Threads, 0, stream>>>(q, n, scale_inv, kind_of(fp8_e4m3),
                                                          static_cast<__nv_bfloat16*>(out));
  }
  CPF_CUDA_CHECK(cudaGetLastError());
}

void launch_fp8_scale(const float* amax, double fp8_max, int64_t margin, const float* fallback, float* out,
                      cudaStream_t stream) {
  scale_kernel<<<1, 1, 0, stream>>>(amax, fp8_max, margin, fallback, out);
  CPF_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cpf::cuda::kernels

namespace cpf::cuda::kernels {
namespace {

// One thread per entry: the roll, the new scale and the reset, as the CPU's cpu_update computes them.
__global__ void update_scales_kernel(float* history, float* amax, float* scale, const float* fp8_max, int64_t entries,
                                     int64_t length, int64_t margin, bool most_recent, const void* skip, bool skip_f64,
                                     float* clipped) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= entries) return;
  bool skip_step = false;
  if (skip != nullptr) {
    const double v = skip_f64 ? *static_cast<const double*>(skip) : *static_cast<const float*>(skip);
    skip_step = !isfinite(v);
  }
  float* row = history + e * length;
  const float a = amax[e];
  if (!skip_step && isfinite(a)) {
    bool had_history = false;
    for (int64_t i = 0; i < length; ++i) had_history = had_history || row[i] > 0.0f;
    if (clipped != nullptr && had_history && static_cast<double>(a) * scale[e] > static_cast<double>(fp8_max[e])) {
      atomicAdd(clipped, 1.0f);
    }
    for (int64_t i = length - 1; i > 0; --i) row[i] = row[i - 1];
    row[0] = a;
  }
  amax[e] = 0.0f;
  float used = row[0];
  if (!most_recent) {
    for (int64_t i = 1; i < length; ++i) used = row[i] > used ? row[i] : used;  // no NaN is ever pushed
  }
  if (isfinite(used) && used > 0.0f) {
    scale[e] = static_cast<float>(static_cast<double>(fp8_max[e]) / static_cast<double>(used) /
                                  ldexp(1.0, static_cast<int>(margin)));
  }
}

}  // namespace

void launch_fp8_update_scales(float* history, float* amax, float* scale, const float* fp8_max, int64_t entries,
                              int64_t length, int64_t margin, bool most_recent, const void* skip, bool skip_f64,
                              float* clipped, cudaStream_t stream) {
  constexpr int kThreads = 128;
  const int blocks = static_cast<int>((entries + kThreads - 1) / kThreads);
  update_scales_kernel<<<blocks, kThreads, 0, stream>>>(history, amax, scale, fp8_max, entries, length, margin,
                                                        most_recent, skip, skip_f64, clipped);
  CPF_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cpf::cuda::kernels
