// The glue of the CP merge kernel (lse_merge_kernel.cu): checks the contract of cp::DeviceMergeFn
// (lse_merge.h) and launches on the current stream.
#include "attention/cuda/lse_merge_cuda.h"

#include "attention/cuda/lse_merge_kernel.cuh"
#include "framework/core/error.h"
#include "framework/tensor/cuda/runtime.cuh"

namespace cpf::attention_cuda {

void lse_merge(const Tensor& acc_out, const Tensor& acc_lse, const Tensor& part_out, const Tensor& part_lse) {
  const DType acc = acc_out.dtype();
  CPF_CHECK((acc == DType::f32 || acc == DType::f64) && acc_lse.dtype() == acc && part_lse.dtype() == acc,
            "cp merge (cuda): the accumulators and the part's lse must share an f32/f64 dtype: out ", acc, ", lse ",
            acc_lse.dtype(), ", part lse ", part_lse.dtype());
  CPF_CHECK(part_out.dtype() == DType::f32 || part_out.dtype() == DType::f64 || part_out.dtype() == DType::bf16,
            "cp merge (cuda): the part's out must be f32, f64 or bf16, got ", part_out.dtype());
  CPF_CHECK(acc_out.dim() == 3 && part_out.shape() == acc_out.shape() && acc_lse.dim() == 2 &&
                acc_lse.size(0) == acc_out.size(1) && acc_lse.size(1) == acc_out.size(0) &&
                part_lse.shape() == acc_lse.shape(),
            "cp merge (cuda): out (T, H, D) and lse (H, T) expected: out ", acc_out.shape(), ", part out ",
            part_out.shape(), ", lse ", acc_lse.shape(), ", part lse ", part_lse.shape());
  CPF_CHECK(acc_out.is_contiguous() && acc_lse.is_contiguous() && part_out.is_contiguous() && part_lse.is_contiguous(),
            "cp merge (cuda): every tensor must be contiguous");
  const int device = acc_out.device().index;
  for (const Tensor* t : {&acc_lse, &part_out, &part_lse}) {
    CPF_CHECK(t->device() == acc_out.device(), "cp merge (cuda): tensors on ", t->device(), " and ", acc_out.device());
  }
  cuda::DeviceGuard guard(device);
  merge::launch_lse_merge(static_cast<int>(acc), static_cast<int>(part_out.dtype()), acc_out.raw_data(),
                          acc_lse.raw_data(), part_out.raw_data(), part_lse.raw_data(), acc_out.size(0),
                          acc_out.size(1), acc_out.size(2), cuda::current_cuda_stream(device));
  acc_out.bump_version();
  acc_lse.bump_version();
}

void accumulate(const Tensor& acc, const Tensor& part) {
  CPF_CHECK(acc.dtype() == DType::f32 || acc.dtype() == DType::f64,
            "cp accumulate (cuda): the accumulator must be f32 or f64, got ", acc.dtype());
  CPF_CHECK(part.dtype() == DType::f32 || part.dtype() == DType::f64 || part.dtype() == DType::bf16,
            "cp accumulate (cuda): the part must be f32, f64 or bf16, got ", part.dtype());
  CPF_CHECK(part.shape() == acc.shape(), "cp accumulate (cuda): part ", part.shape(),
            " does not match the accumulator ", acc.shape());
  CPF_CHECK(acc.is_contiguous() && part.is_contiguous(), "cp accumulate (cuda): both tensors must be contiguous");
  CPF_CHECK(part.device() == acc.device(), "cp accumulate (cuda): tensors on ", part.device(), " and ", acc.device());
  cuda::DeviceGuard guard(acc.device().index);
  merge::launch_accumulate(static_cast<int>(acc.dtype()), static_cast<int>(part.dtype()), acc.raw_data(),
                           part.raw_data(), acc.numel(), cuda::current_cuda_stream(acc.device().index));
  acc.bump_version();
}

}  // namespace cpf::attention_cuda
