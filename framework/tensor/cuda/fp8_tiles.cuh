#pragma once
// The pieces the FP8 cast kernels share (fp8.cu: one tensor; fp8_rows.cu: many weights in one launch);
// private to the CUDA backend.
//
//   block_amax   the block's max of |x| folded into one f32 in memory: a block reduction, then one atomicMax
//                on the float's bits (non-negative floats order like their bits, and NaN's bits are above
//                infinity's, so a NaN wins as on the CPU)
//   cast_tile    a 64 x 64 tile cast to FP8, written row-wise to q and, through shared memory, column-wise
//                to qt (both coalesced); the values come from a loader; optionally the tile's column sums
//                (a linear's bias gradient from the cast of its output gradient, without another read)
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace cpf::cuda::kernels::fp8_tiles {

constexpr int kFp8Threads = 256;  // every FP8 cast kernel: 256 threads (the 32 x 32 transposing one as 32 x 8)
constexpr int kTile = 64;         // cast_tile's edge

__device__ __forceinline__ float load_float(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load_float(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ float load_float(const double* p, int64_t i) { return static_cast<float>(p[i]); }

__device__ __forceinline__ unsigned abs_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

// The block's max of `v` (|x| bits) into *amax; tid: the thread's index in the block (0 .. kFp8Threads).
__device__ __forceinline__ void block_amax(unsigned v, float* amax, int tid) {
  __shared__ unsigned warp_max[kFp8Threads / 32];
  for (int delta = 16; delta > 0; delta >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, delta));
  if ((tid & 31) == 0) warp_max[tid / 32] = v;
  __syncthreads();
  if (tid < 32) {
    v = tid < kFp8Threads / 32 ? warp_max[tid] : 0u;
    for (int delta = 16; delta > 0; delta >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, delta));
    if (tid == 0) atomicMax(reinterpret_cast<unsigned*>(amax), v);
  }
}

// Loaders: the V values of row r, columns c .. c + V - 1 of the tensor being cast, as floats; c is a
// multiple of V and the row's data 16-byte aligned. PlainLoad reads a row-major (rows, cols) tensor.
template <class In>
struct PlainLoad {
  static constexpr int V = 16 / sizeof(In);
  const In* x;
  int64_t cols;
  __device__ __forceinline__ void operator()(int64_t r, int64_t c, float* f) const {
    const uint4 raw = *reinterpret_cast<const uint4*>(x + r * cols + c);
    const In* e = reinterpret_cast<const In*>(&raw);
#pragma unroll
    for (int k = 0; k < V; ++k) f[k] = load_float(e, k);
  }
};

// The tile's column sums when asked for: each thread adds up the rows it loads (one column group, every
// kRowGroups-th row), the groups' sums meet in shared memory, and 64 threads add them in a fixed order into
// column_sums[c0 .. c0 + 63], one f32 row of partial sums per tile row (deterministic: no atomics).
template <int V>
struct TileColumnSums {
  static constexpr int kVectorsPerRow = kTile / V, kRowGroups = kFp8Threads / kVectorsPerRow;
  float acc[V] = {};
  __device__ __forceinline__ void add(const float* f) {
#pragma unroll
    for (int k = 0; k < V; ++k) acc[k] += f[k];
  }
  // Every thread calls it (it syncs the block).
  __device__ __forceinline__ void write(float* column_sums, int64_t c0) const {
    __shared__ float groups[kRowGroups][kTile];
    const int group = threadIdx.x / kVectorsPerRow, c = (threadIdx.x % kVectorsPerRow) * V;
#pragma unroll
    for (int k = 0; k < V; ++k) groups[group][c + k] = acc[k];
    __syncthreads();
    if (threadIdx.x < kTile) {
      float sum = 0.0f;
      for (int g = 0; g < kRowGroups; ++g) sum += groups[g][threadIdx.x];
      column_sums[c0 + threadIdx.x] = sum;
    }
  }
};

// Casts the tile at (r0, c0) of the loaded tensor (load.cols columns) with scale s: q (or null) row-major
// with load.cols columns, qt column-major with leading dimension qt_ld (qt's row c holds column c; a
// weight's row block writes its columns of a wider qt). Returns the thread's max |x| bits. Every thread of
// the block (kFp8Threads) calls it; it syncs the block. q and qt 8-byte aligned, qt_ld a multiple of 8.
// column_sums (or null): the tile's sums of its 64 rows, f32, written at column_sums[c0 ..] (TileColumnSums).
template <class Load>
__device__ __forceinline__ unsigned cast_tile(const Load& load, int64_t r0, int64_t c0, int64_t qt_ld, float s,
                                              __nv_fp8_interpretation_t kind, uint8_t* q, uint8_t* qt,
                                              float* column_sums = nullptr) {
  constexpr int V = Load::V, kVectorsPerRow = kTile / V;
  const int64_t cols = load.cols;
  __shared__ uint8_t tile[kTile][kTile + 4];  // (tile rows, tile cols), padded against bank conflicts
  unsigned m = 0;
  TileColumnSums<V> sums;
  for (int v = threadIdx.x; v < kTile * kVectorsPerRow; v += kFp8Threads) {
    const int r = v / kVectorsPerRow, c = (v % kVectorsPerRow) * V;
    float f[V];
    load(r0 + r, c0 + c, f);
    if (column_sums != nullptr) sums.add(f);
    alignas(8) uint8_t b[V];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      m = max(m, abs_bits(f[k]));
      b[k] = __nv_cvt_float_to_fp8(__fmul_rn(f[k], s), __NV_SATFINITE, kind);  // one rounded f32 product
      tile[r][c + k] = b[k];
    }
    if (q != nullptr) {
      uint8_t* dst = q + (r0 + r) * cols + c0 + c;
      if constexpr (V == 8) {
        *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(b);
      } else {
        *reinterpret_cast<uint32_t*>(dst) = *reinterpret_cast<const uint32_t*>(b);
      }
    }
  }
  __syncthreads();
  // qt's rows c0 .. c0 + 63, 64 bytes each (rows r0 .. r0 + 63 of x), written 8 bytes a thread.
  for (int w = threadIdx.x; w < kTile * (kTile / 8); w += kFp8Threads) {
    const int c = w / (kTile / 8), r = (w % (kTile / 8)) * 8;
    alignas(8) uint8_t out[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) out[k] = tile[r + k][c];
    *reinterpret_cast<uint2*>(qt + (c0 + c) * qt_ld + r0 + r) = *reinterpret_cast<const uint2*>(out);
  }
  if (column_sums != nullptr) sums.write(column_sums, c0);
  return m;
}

__device__ __forceinline__ __nv_fp8_interpretation_t fp8_kind(bool e4m3) { return e4m3 ? __NV_E4M3 : __NV_E5M2; }

}  // namespace cpf::cuda::kernels::fp8_tiles
