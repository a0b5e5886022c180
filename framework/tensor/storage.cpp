#include "framework/tensor/storage.h"

#include <array>
#include <cstdlib>
#include <cstring>
#include <new>

#include "framework/core/error.h"

namespace cpf {
namespace {

// Host memory, 64-byte aligned so Eigen and the vectorised loops get full-width aligned loads.
class CpuBackend final : public DeviceBackend {
 public:
  void* allocate(size_t nbytes, Device) override {
    if (nbytes == 0) return nullptr;
    const size_t rounded = (nbytes + 63) / 64 * 64;
    void* ptr = std::aligned_alloc(64, rounded);
    CPF_CHECK(ptr != nullptr, "out of host memory: could not allocate ", nbytes, " bytes");
    return ptr;
  }
  void deallocate(void* ptr, size_t, Device) noexcept override { std::free(ptr); }
  void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) override {
    CPF_CHECK(dst_device.is_cpu() && src_device.is_cpu(), "cpu backend cannot copy ", src_device, " -> ",
              dst_device);
    if (nbytes) std::memcpy(dst, src, nbytes);
  }
  void fill_zero(void* ptr, size_t nbytes, Device) override {
    if (nbytes) std::memset(ptr, 0, nbytes);
  }
  int device_count() const override { return 1; }
};

std::array<DeviceBackend*, 2>& backends() {
  static CpuBackend cpu;
  static std::array<DeviceBackend*, 2> table{&cpu, nullptr};
  return table;
}

}  // namespace

void register_device_backend(DeviceType type, DeviceBackend* backend) {
  backends()[static_cast<size_t>(type)] = backend;
}

bool has_device_backend(DeviceType type) { return backends()[static_cast<size_t>(type)] != nullptr; }

DeviceBackend& device_backend(DeviceType type) {
  DeviceBackend* backend = backends()[static_cast<size_t>(type)];
  CPF_CHECK(backend != nullptr, "no backend for device type ", Device(type).str(),
            ": this build has no CUDA support (configure with -DCPF_WITH_CUDA=ON on a machine with nvcc)");
  return *backend;
}

Storage::Storage(size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  data_ = device_backend(device.type).allocate(nbytes, device);
}

Storage::~Storage() {
  if (data_ != nullptr) device_backend(device_.type).deallocate(data_, nbytes_, device_);
}

}  // namespace cpf
