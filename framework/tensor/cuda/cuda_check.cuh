#pragma once
// Status checks for CUDA runtime calls (private to framework/tensor/cuda: includes CUDA headers).
// A failure throws cpf::Error naming the call and CUDA's error string:
//   CPF_CUDA_CHECK(cudaMemcpyAsync(...))
//     -> "CUDA error in cudaMemcpyAsync(...): invalid argument (cudaErrorInvalidValue)"
#include <cuda_runtime.h>

#include "framework/core/error.h"

namespace cpf::cuda {

// The CPF_CUDA_SYNC=1 debug mode (device_errors.cu): after each launch, wait for the device and throw
// what went wrong in that launch (an asynchronous fault, or an index error recorded on the device).
bool sync_debug_enabled();
void sync_after_launch(const char* what);

}  // namespace cpf::cuda

namespace cpf::cuda::detail {

[[noreturn]] void throw_cuda_error(const char* file, int line, const char* call, cudaError_t status);

}  // namespace cpf::cuda::detail

#define CPF_CUDA_CHECK(call)                                                         \
  do {                                                                               \
    const cudaError_t cpf_status_ = (call);                                          \
    if (cpf_status_ != cudaSuccess) [[unlikely]] {                                   \
      ::cpf::cuda::detail::throw_cuda_error(__FILE__, __LINE__, #call, cpf_status_); \
    }                                                                                \
  } while (0)

// After a kernel launch: reports launch failures (bad configuration, no kernel image for this GPU);
// in the CPF_CUDA_SYNC=1 debug mode also waits for the kernel and reports its faults.
#define CPF_CUDA_CHECK_LAUNCH(what)                                                 \
  do {                                                                              \
    const cudaError_t cpf_status_ = cudaGetLastError();                             \
    if (cpf_status_ != cudaSuccess) [[unlikely]] {                                  \
      ::cpf::cuda::detail::throw_cuda_error(__FILE__, __LINE__, what, cpf_status_); \
    }                                                                               \
    if (::cpf::cuda::sync_debug_enabled()) [[unlikely]]                             \
      ::cpf::cuda::sync_after_launch(what);                                         \
  } while (0)
