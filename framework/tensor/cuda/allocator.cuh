#pragma once
// The caching device allocator (private to framework/tensor/cuda). One per device.
//
// Sizes are rounded to a size class: multiples of 512 B below 1 MiB, then 8 classes per power of two
// (at most 12.5% waste). A freed block goes back to the free list of (its stream, its class) and the
// next allocation of that class on that stream takes it: work queued on one stream runs in order, so
// the new owner's kernels cannot start before the old owner's are done, and no event is needed.
// cudaMalloc happens only when the list is empty; when it fails, every cached block of the device is
// released (after a device synchronisation) and the cudaMalloc retried once before reporting
// out-of-memory with the requested size, the allocated, reserved and peak figures and the device's
// free/total memory.
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "framework/tensor/cuda/cuda.h"

namespace cpf::cuda {

class CachingAllocator {
 public:
  explicit CachingAllocator(int device) : device_(device) {}

  void* allocate(size_t nbytes, cudaStream_t stream);
  // Never throws (called from Storage's destructor); unknown pointers are ignored.
  void free(void* ptr) noexcept;
  void empty_cache();
  MemoryStats stats();
  void reset_peak();

  // The size class `nbytes` is served from.
  static size_t round_size(size_t nbytes);

 private:
  struct Block {
    size_t size = 0;
    cudaStream_t stream = nullptr;
  };
  using PoolKey = std::pair<cudaStream_t, size_t>;

  // Releases every cached block; the caller holds mutex_ and has synchronised the device.
  void release_cached_locked();

  int device_;
  std::mutex mutex_;
  std::unordered_map<void*, Block> active_;
  std::map<PoolKey, std::vector<void*>> free_;
  MemoryStats stats_;
};

// The allocator of `device` (created on first use, never destroyed: blocks outlive static
// destruction order, and the driver reclaims them at exit).
CachingAllocator& allocator_for(int device);

}  // namespace cpf::cuda
