#pragma once
// Host memory posing as a CUDA device, for CPU-build tests of device checks: tensors "on cuda:0"
// can be created and copied (the backend's byte copies), so mismatched-device and no-kernel errors
// can be triggered without a GPU. Tests skip when a real CUDA backend is registered.
#include <cstdlib>
#include <cstring>

#include "framework/tensor/storage.h"

namespace cpf::testing {

class HostAsDevice final : public DeviceBackend {
 public:
  void* allocate(size_t nbytes, Device) override { return nbytes ? std::malloc(nbytes) : nullptr; }
  void deallocate(void* ptr, size_t, Device) noexcept override { std::free(ptr); }
  void copy(void* dst, Device, const void* src, Device, size_t nbytes) override {
    if (nbytes) std::memcpy(dst, src, nbytes);
  }
  void fill_zero(void* ptr, size_t nbytes, Device) override {
    if (nbytes) std::memset(ptr, 0, nbytes);
  }
  int device_count() const override { return 1; }
};

}  // namespace cpf::testing
