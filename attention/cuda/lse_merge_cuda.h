#pragma once
// Private to cpf_attention_cuda: the CUDA kernel of the CP merge, registered as the cuda slot of
// cp::device_merge() (attention/cp/lse_merge.h) by register.cpp.
#include "framework/tensor/tensor.h"

namespace cpf::attention_cuda {

// cp::DeviceMergeFn on CUDA tensors: runs on the calling thread's current stream of their device.
void lse_merge(const Tensor& acc_out, const Tensor& acc_lse, const Tensor& part_out, const Tensor& part_lse);

// cp::DeviceAccumulateFn on CUDA tensors (acc += part, the part read in its own dtype), registered as
// the cuda slot of cp::device_accumulate(); on the current stream.
void accumulate(const Tensor& acc, const Tensor& part);

}  // namespace cpf::attention_cuda
