#pragma once
// Status checks for CUDA runtime calls (private to framework/tensor/cuda: includes CUDA headers).
// A failure throws cpf::Error naming the call and CUDA's error string:
//   CPF_CUDA_CHECK(cudaMemcpyAsync(...))
//     -> "CUDA error in cudaMemcpyAsync(...): invalid argument (cudaErrorInvalidValue)"
#include <cuda_runtime.h>

#include "framework/core/error.h"

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

// After a kernel launch: reports launch failures (bad configuration, no kernel image for this GPU).
#define CPF_CUDA_CHECK_LAUNCH(what)                                                    \
  do {                                                                               \
    const cudaError_t cpf_status_ = cudaGetLastError();                              \
    if (cpf_status_ != cudaSuccess) [[unlikely]] {                                   \
      ::cpf::cuda::detail::throw_cuda_error(__FILE__, __LINE__, what, cpf_status_);  \
    }                                                                                \
  } while (0)
