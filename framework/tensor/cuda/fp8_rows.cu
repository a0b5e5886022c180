// Many weights cast to FP8 in one launch (fp8_kernels.cuh, launch_fp8_rows_*): the FP8 weight copies of a
// training step (framework/autograd/fp8_weight_cache.h) made together rather than a launch or three per
// weight, and linear_cat's row blocks cast where they lie rather than from an f32 concatenation.
//
//   job j:  part (rows_j, cols) of a weight W (N, cols) at rows [row_j, row_j + rows_j)
//           q   -> W's codes, rows [row_j, ...)          (q_j = q + row_j * cols)
//           qt  -> W^T's codes, columns [row_j, ...)     (qt_j = qt + row_j, leading dimension N)
//
// The grid is one 64 x 64 tile per block over every job's tiles in turn (first_tile: the prefix sums);
// the jobs travel in the kernel's parameters, kRowJobs a launch. A weight's parts share its scale and
// amax, so its codes are those of casting the concatenation (cast_tile's values are per element).
#include <algorithm>

#include "framework/tensor/cuda/cuda_check.cuh"
#include "framework/tensor/cuda/fp8_kernels.cuh"
#include "framework/tensor/cuda/fp8_tiles.cuh"
#include "framework/tensor/cuda/kernels.cuh"

namespace cpf::cuda::kernels {
namespace {

using namespace fp8_tiles;

constexpr int kRowJobs = 48;  // jobs per launch: 48 jobs of 64 bytes and their prefix sums fit the 4 KB of parameters

struct RowJobList {
  Fp8RowJob job[kRowJobs];
  int64_t first_tile[kRowJobs + 1];  // prefix sums of each job's tile count
  int count;
};

// The job holding tile t: binary search over the prefix sums.
__device__ __forceinline__ int job_of(const RowJobList& list, int64_t t) {
  int lo = 0, hi = list.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (list.first_tile[mid] <= t) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

template <class In>
__global__ void __launch_bounds__(kFp8Threads)
    cast_rows_kernel(const __grid_constant__ RowJobList list, __nv_fp8_interpretation_t kind) {
  const int64_t t = blockIdx.x;
  const int j = job_of(list, t);
  const Fp8RowJob& job = list.job[j];
  const int64_t tile = t - list.first_tile[j], tiles_per_row = job.cols / kTile;
  const int64_t r0 = tile / tiles_per_row * kTile, c0 = tile % tiles_per_row * kTile;
  const PlainLoad<In> load{static_cast<const In*>(job.x), job.cols};
  const unsigned m = cast_tile(load, r0, c0, job.qt_ld, *job.scale, kind, job.q, job.qt);
  if (job.amax != nullptr) block_amax(m, job.amax, threadIdx.x);  // uniform over the block: one job a block
}

template <class In>
__global__ void __launch_bounds__(kFp8Threads) amax_rows_kernel(const __grid_constant__ RowJobList list) {
  const int64_t t = blockIdx.x;
  const int j = job_of(list, t);
  const Fp8RowJob& job = list.job[j];
  const int64_t tile = t - list.first_tile[j], tiles_per_row = job.cols / kTile;
  const int64_t r0 = tile / tiles_per_row * kTile, c0 = tile % tiles_per_row * kTile;
  constexpr int V = PlainLoad<In>::V, kVectorsPerRow = kTile / V;
  const PlainLoad<In> load{static_cast<const In*>(job.x), job.cols};
  unsigned m = 0;
  for (int v = threadIdx.x; v < kTile * kVectorsPerRow; v += kFp8Threads) {
    float f[V];
    load(r0 + v / kVectorsPerRow, c0 + (v % kVectorsPerRow) * V, f);
#pragma unroll
    for (int k = 0; k < V; ++k) m = max(m, abs_bits(f[k]));
  }
  block_amax(m, job.amax, threadIdx.x);
}

// Calls launch(list, tiles) for each run of up to kRowJobs jobs.
template <class Launch>
void for_each_launch(const Fp8RowJob* jobs, int count, Launch&& launch) {
  for (int begin = 0; begin < count; begin += kRowJobs) {
    RowJobList list{};
    list.count = std::min(kRowJobs, count - begin);
    list.first_tile[0] = 0;
    for (int j = 0; j < list.count; ++j) {
      const Fp8RowJob& job = jobs[begin + j];
      list.job[j] = job;
      list.first_tile[j + 1] = list.first_tile[j] + (job.rows / kTile) * (job.cols / kTile);
    }
    const int64_t tiles = list.first_tile[list.count];
    CPF_CHECK(tiles <= 0x7fffffff, "fp8 row casts (cuda): ", tiles, " tiles in one launch are more than a grid takes");
    if (tiles > 0) launch(list, static_cast<unsigned>(tiles));
  }
}

}  // namespace

bool fp8_row_job_fits(const Fp8RowJob& job) {
  const auto aligned = [](const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; };
  return job.rows > 0 && job.cols > 0 && job.rows % kTile == 0 && job.cols % kTile == 0 && job.qt_ld % 8 == 0 &&
         aligned(job.x, 16) && aligned(job.q, 8) && aligned(job.qt, 8);
}

void launch_fp8_rows_cast(int dtype, bool fp8_e4m3, const Fp8RowJob* jobs, int count, cudaStream_t stream) {
  const __nv_fp8_interpretation_t kind = fp8_e4m3 ? __NV_E4M3 : __NV_E5M2;
  for_each_launch(jobs, count, [&](const RowJobList& list, unsigned tiles) {
    if (dtype == kF32) {
      cast_rows_kernel<float><<<tiles, kFp8Threads, 0, stream>>>(list, kind);
    } else {
      cast_rows_kernel<__nv_bfloat16><<<tiles, kFp8Threads, 0, stream>>>(list, kind);
    }
    CPF_CUDA_CHECK(cudaGetLastError());
  });
}

void launch_fp8_rows_amax(int dtype, const Fp8RowJob* jobs, int count, cudaStream_t stream) {
  for_each_launch(jobs, count, [&](const RowJobList& list, unsigned tiles) {
    if (dtype == kF32) {
      amax_rows_kernel<float><<<tiles, kFp8Threads, 0, stream>>>(list);
    } else {
      amax_rows_kernel<__nv_bfloat16><<<tiles, kFp8Threads, 0, stream>>>(list);
    }
    CPF_CUDA_CHECK(cudaGetLastError());
  });
}

}  // namespace cpf::cuda::kernels
