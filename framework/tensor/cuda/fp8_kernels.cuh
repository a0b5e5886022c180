#pragma once
// The FP8 cast kernels (fp8.cu) behind DeviceOps' FP8 entries (fp8_ops.cpp); private to the CUDA backend.
// dtype codes are kernels.cuh's (kF32, kBF16, kF64); fp8_e4m3 picks E4M3 over E5M2. Scales and amaxes
// are single f32 values in device memory, read and written by the kernels.
#include <cuda_runtime.h>

#include <cstdint>

namespace cpf::cuda::kernels {

// *amax = max(*amax, max |x|) over n elements of dtype (NaN wins); *amax >= 0 or NaN on entry.
void launch_fp8_amax(int dtype, const void* x, int64_t n, float* amax, int sm_count, cudaStream_t stream);
// q[i] = fp8(x[i] * *scale) saturating, round to nearest even; amax (or null) as launch_fp8_amax.
void launch_quantize_fp8(int dtype, bool fp8_e4m3, const void* x, int64_t n, const float* scale, uint8_t* q,
                         float* amax, int sm_count, cudaStream_t stream);
// x (rows, cols) -> q (rows, cols; null: not written) and qt (cols, rows) = the same codes transposed, in
// one pass (tiles through shared memory); amax as above. rows / 32 must fit a grid's y (65535).
// column_sums (or null): (cols) f32 = x summed over its rows, from the same read where the 64 x 64 tiles
// take the shape, through partials: scratch of (column_sum_blocks(rows), cols) f32.
int64_t column_sum_blocks(int64_t rows);
void launch_quantize_fp8_transposed(int dtype, bool fp8_e4m3, const void* x, int64_t rows, int64_t cols,
                                    const float* scale, uint8_t* q, uint8_t* qt, float* amax, cudaStream_t stream,
                                    float* partials = nullptr, float* column_sums = nullptr);
// The casts of an activation's output h (rows, cols) computed from its input pre, bf16, contiguous: kFp8Gelu
// pre (rows, cols), h = gelu(pre); kFp8Swiglu pre (rows, 2 cols) = [gate | up], h = silu(gate) * up; h
// rounded to bf16 as the element-wise kernels write it. *amax = max(*amax, max |h|); the quantize writes
// q (or null) and qt as launch_quantize_fp8_transposed would from h. Both return false, launching nothing,
// unless rows and cols are multiples of 64 and pre is 16-byte aligned (the caller then materialises h).
enum Fp8ActivationCode : int { kFp8Gelu = 1, kFp8Swiglu = 2 };
bool launch_fp8_activation_amax(int activation, const void* pre, int64_t rows, int64_t cols, float* amax, int sm_count,
                                cudaStream_t stream);
bool launch_quantize_fp8_activation(int activation, bool fp8_e4m3, const void* pre, int64_t rows, int64_t cols,
                                    const float* scale, uint8_t* q, uint8_t* qt, float* amax, cudaStream_t stream);
// out[i] (dtype kF32 or kBF16) = decode(q[i]) * *scale_inv.
void launch_dequantize_fp8(int dtype, bool fp8_e4m3, const uint8_t* q, int64_t n, const float* scale_inv, void* out,
                           int sm_count, cudaStream_t stream);
// *out = fp8_max / *amax / 2^margin when *amax is finite and > 0, else *fallback (null: 1).
void launch_fp8_scale(const float* amax, double fp8_max, int64_t margin, const float* fallback, float* out,
                      cudaStream_t stream);
// Delayed scaling's update of `entries` rows (framework/tensor/ops/fp8_scale_update.h): history (entries,
// length), amax, scale, fp8_max (entries); skip (null, or one f32 / f64 value per skip_f64) non-finite drops
// the step. One thread per entry.
void launch_fp8_update_scales(float* history, float* amax, float* scale, const float* fp8_max, int64_t entries,
                              int64_t length, int64_t margin, bool most_recent, const void* skip, bool skip_f64,
                              float* clipped, cudaStream_t stream);

// Casts of many row blocks (fp8_rows.cu): job j casts x (rows, cols) with *scale into q (rows, cols; null: not
// written) and its transpose into qt at leading dimension qt_ld (qt's row c at qt + c * qt_ld); *amax (or
// null) = max(*amax, max |x|). A weight's row blocks (linear_cat's parts) point into one q and qt and share
// one scale and amax. Every job must fit (fp8_row_job_fits: rows and cols multiples of 64, x 16-byte and q,
// qt 8-byte aligned, qt_ld a multiple of 8); all jobs of a call have dtype (kF32 or kBF16).
struct Fp8RowJob {
  const void* x;
  uint8_t* q;
  uint8_t* qt;
  const float* scale;
  float* amax;
  int64_t rows, cols, qt_ld;
};
bool fp8_row_job_fits(const Fp8RowJob& job);
void launch_fp8_rows_cast(int dtype, bool fp8_e4m3, const Fp8RowJob* jobs, int count, cudaStream_t stream);
// *amax = max(*amax, max |x|) for every job (amax non-null): the current-scaling amaxes of many weights.
void launch_fp8_rows_amax(int dtype, const Fp8RowJob* jobs, int count, cudaStream_t stream);

}  // namespace cpf::cuda::kernels
