#pragma once
// The CP merge kernel (attention/cp/lse_merge.h, PartialMerge::add) with plain parameters, as in
// unfused_kernels.cuh: the glue (lse_merge_cuda.cpp) turns tensors into pointers.
#include <cuda_runtime.h>

#include <cstdint>

namespace cpf::attention_cuda::merge {

// In place over `tokens` x `heads` rows of `dim` values: acc_out (T, H, D) and acc_lse (H, T) of
// acc_dtype (cpf::DType code: 0 f32, 1 f64), part_out (T, H, D) of part_dtype (0 f32, 1 f64, 2 bf16),
// part_lse (H, T) of acc_dtype; all contiguous. Rows whose part lse is -inf are left as they are.
void launch_lse_merge(int acc_dtype, int part_dtype, void* acc_out, void* acc_lse, const void* part_out,
                      const void* part_lse, int64_t tokens, int64_t heads, int64_t dim, cudaStream_t stream);

// acc[i] += part[i] for `count` elements: acc of acc_dtype (0 f32, 1 f64), part of part_dtype (0 f32,
// 1 f64, 2 bf16), both contiguous. The part is read once in its own dtype.
void launch_accumulate(int acc_dtype, int part_dtype, void* acc, const void* part, int64_t count, cudaStream_t stream);

}  // namespace cpf::attention_cuda::merge
