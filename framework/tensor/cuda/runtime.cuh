#pragma once
// Per-thread device and stream state of the CUDA backend (private: includes CUDA headers).
#include <cuda_runtime.h>

#include "framework/tensor/cuda/cuda_check.cuh"

namespace cpf::cuda {

// Devices this backend supports at most (ordinals 0..kMaxDevices-1).
inline constexpr int kMaxDevices = 16;

// Throws a readable error unless `device` names a visible GPU.
void check_device_index(int device);

// This thread's current stream on `device` (nullptr = the legacy default stream).
cudaStream_t current_cuda_stream(int device);
// Makes `stream` current for `device` on this thread (the DeviceBackend's stream hooks; the public
// form is set_current_stream(Stream)).
void set_current_cuda_stream(int device, cudaStream_t stream);

// Makes `device` current for the scope (cudaSetDevice), restoring the previous device afterwards.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// Cached device properties used to size launches.
struct DeviceInfo {
  int sm_count = 0;
  int max_threads_per_sm = 0;
};
const DeviceInfo& device_info(int device);

}  // namespace cpf::cuda
