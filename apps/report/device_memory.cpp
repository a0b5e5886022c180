#include "apps/report/device_memory.h"

#if CPF_HAVE_CUDA
#include "framework/tensor/cuda/cuda.h"
#endif

namespace cpf::trainer {

std::optional<size_t> peak_device_memory(Device device) {
#if CPF_HAVE_CUDA
  if (device.is_cuda()) return cuda::memory_stats(device.index).peak_allocated;
#endif
  (void)device;
  return std::nullopt;
}

void reset_peak_device_memory(Device device) {
#if CPF_HAVE_CUDA
  if (device.is_cuda()) cuda::reset_peak_memory_stats(device.index);
#endif
  (void)device;
}

std::optional<size_t> total_device_memory(Device device) {
#if CPF_HAVE_CUDA
  if (device.is_cuda()) return cuda::total_memory(device.index);
#endif
  (void)device;
  return std::nullopt;
}

}  // namespace cpf::trainer
