#include "framework/tensor/storage.h"

#include <array>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "framework/core/error.h"

namespace cpf {
namespace {

// Host memory, 64-byte aligned so Eigen and the vectorised loops get full-width aligned loads.
//
// Large blocks are cached: glibc serves them with mmap and unmaps them on free, so every large op
// output would otherwise start with a page fault per 4 KiB. Freed blocks of at least kCacheMin
// bytes go to per-size-class free lists (classes within 1/8 of a power of two, so at most 12.5%
// waste) and are handed out again; the cache holds at most CPF_CPU_CACHE_MB (default 1024) MiB.
class CpuBackend final : public DeviceBackend {
 public:
  CpuBackend() {
    if (const char* mb = std::getenv("CPF_CPU_CACHE_MB")) cache_limit_ = static_cast<size_t>(std::atoll(mb)) << 20;
  }
  void* allocate(size_t nbytes, Device) override {
    if (nbytes == 0) return nullptr;
    const size_t size = size_class(nbytes);
    if (size >= kCacheMin) {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = free_.find(size);
      if (it != free_.end() && !it->second.empty()) {
        void* ptr = it->second.back();
        it->second.pop_back();
        cached_bytes_ -= size;
        return ptr;
      }
    }
    void* ptr = std::aligned_alloc(64, size);
    CPF_CHECK(ptr != nullptr, "out of host memory: could not allocate ", nbytes, " bytes");
    return ptr;
  }
  void deallocate(void* ptr, size_t nbytes, Device) noexcept override {
    if (ptr == nullptr) return;
    const size_t size = size_class(nbytes);
    if (size >= kCacheMin) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (cached_bytes_ + size <= cache_limit_) {
        free_[size].push_back(ptr);
        cached_bytes_ += size;
        return;
      }
    }
    std::free(ptr);
  }
  void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) override {
    CPF_CHECK(dst_device.is_cpu() && src_device.is_cpu(), "cpu backend cannot copy ", src_device, " -> ", dst_device);
    if (nbytes) std::memcpy(dst, src, nbytes);
  }
  void fill_zero(void* ptr, size_t nbytes, Device) override {
    if (nbytes) std::memset(ptr, 0, nbytes);
  }
  int device_count() const override { return 1; }

 private:
  static constexpr size_t kCacheMin = size_t{256} << 10;
  static size_t size_class(size_t nbytes) {
    const size_t rounded = (nbytes + 63) / 64 * 64;
    if (rounded < kCacheMin) return rounded;
    size_t power = kCacheMin;
    while (power < rounded) power <<= 1;
    const size_t step = power / 8;  // eight classes per octave
    return (rounded + step - 1) / step * step;
  }
  std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t cached_bytes_ = 0;
  size_t cache_limit_ = size_t{1024} << 20;
};

std::array<DeviceBackend*, 2>& backends() {
  // Never destroyed: tensors in static storage may be freed after other statics are gone.
  static CpuBackend* cpu = new CpuBackend();
  static std::array<DeviceBackend*, 2> table{cpu, nullptr};
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
