#pragma once
// The calling thread's device and stream for one kernel-table entry, set for the entry's scope (private
// to framework/tensor/cuda; ops.cpp and optim_ops.cpp).
#include <cuda_runtime.h>

#include "framework/tensor/cuda/runtime.cuh"
#include "framework/tensor/dtype.h"
#include "framework/tensor/tensor.h"

namespace cpf::cuda {

// The kernels' dtype code (kernels.cuh: kF32, kBF16, ...; ops.cpp checks that they equal DType's values).
inline int code(DType dtype) { return static_cast<int>(dtype); }

struct Launch {
  explicit Launch(Device device)
      : guard(device.index), stream(current_cuda_stream(device.index)), sm_count(device_info(device.index).sm_count) {}
  DeviceGuard guard;
  cudaStream_t stream;
  int sm_count;
};

}  // namespace cpf::cuda
