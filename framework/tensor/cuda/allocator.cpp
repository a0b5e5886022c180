#include "framework/tensor/cuda/allocator.cuh"

#include <algorithm>
#include <array>
#include <bit>
#include <iomanip>
#include <sstream>

#include "framework/tensor/cuda/runtime.cuh"

namespace cpf::cuda {
namespace {

constexpr size_t kSmallAlignment = 512;
constexpr size_t kSmallLimit = size_t(1) << 20;

std::string bytes_str(size_t bytes) {
  std::ostringstream os;
  const double b = static_cast<double>(bytes);
  if (bytes >= (size_t(1) << 30)) {
    os << std::fixed << std::setprecision(2) << b / double(size_t(1) << 30) << " GiB";
  } else if (bytes >= (size_t(1) << 20)) {
    os << std::fixed << std::setprecision(2) << b / double(size_t(1) << 20) << " MiB";
  } else {
    os << bytes << " bytes";
  }
  return os.str();
}

}  // namespace

size_t CachingAllocator::round_size(size_t nbytes) {
  if (nbytes <= kSmallLimit) {
    return std::max<size_t>(kSmallAlignment, (nbytes + kSmallAlignment - 1) / kSmallAlignment * kSmallAlignment);
  }
  // 8 classes per octave: step = 2^(floor(log2(n)) - 3).
  const size_t step = std::bit_floor(nbytes) >> 3;
  return (nbytes + step - 1) / step * step;
}

void* CachingAllocator::allocate(size_t nbytes, cudaStream_t stream) {
  if (nbytes == 0) return nullptr;
  const size_t size = round_size(nbytes);
  std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.allocations;
  void* ptr = nullptr;
  auto it = free_.find({stream, size});
  if (it != free_.end() && !it->second.empty()) {
    ptr = it->second.back();
    it->second.pop_back();
    ++stats_.cache_hits;
  } else {
    DeviceGuard guard(device_);
    cudaError_t status = cudaMalloc(&ptr, size);
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      // Cached blocks may still be in use by queued kernels of their streams: wait, then release.
      CPF_CUDA_CHECK(cudaDeviceSynchronize());
      release_cached_locked();
      status = cudaMalloc(&ptr, size);
    }
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      size_t free_bytes = 0, total_bytes = 0;
      (void)cudaMemGetInfo(&free_bytes, &total_bytes);
      (void)cudaGetLastError();
      CPF_FAIL("cuda:", device_, " out of memory: tried to allocate ", bytes_str(size), " (", nbytes,
               " bytes requested); allocated ", bytes_str(stats_.allocated), ", reserved ", bytes_str(stats_.reserved),
               ", peak allocated ", bytes_str(stats_.peak_allocated), "; the device has ", bytes_str(free_bytes),
               " free of ", bytes_str(total_bytes));
    }
    CPF_CUDA_CHECK(status);
    ++stats_.device_mallocs;
    stats_.reserved += size;
    stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
  }
  active_[ptr] = Block{size, stream};
  stats_.allocated += size;
  stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
  return ptr;
}

void CachingAllocator::free(void* ptr) noexcept {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = active_.find(ptr);
  if (it == active_.end()) return;
  const Block block = it->second;
  active_.erase(it);
  stats_.allocated -= block.size;
  try {
    free_[{block.stream, block.size}].push_back(ptr);
  } catch (...) {
    // Out of host memory for the list: give the block back to the driver instead of caching it.
    if (cudaFree(ptr) == cudaSuccess) {
      stats_.reserved -= block.size;
      ++stats_.device_frees;
    }
    (void)cudaGetLastError();
  }
}

void CachingAllocator::release_cached_locked() {
  for (auto& [key, ptrs] : free_) {
    for (void* p : ptrs) {
      CPF_CUDA_CHECK(cudaFree(p));
      stats_.reserved -= key.second;
      ++stats_.device_frees;
    }
  }
  free_.clear();
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  DeviceGuard guard(device_);
  CPF_CUDA_CHECK(cudaDeviceSynchronize());
  release_cached_locked();
}

MemoryStats CachingAllocator::stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_allocated = stats_.allocated;
  stats_.peak_reserved = stats_.reserved;
}

CachingAllocator& allocator_for(int device) {
  static std::array<CachingAllocator*, kMaxDevices> allocators{};
  static std::mutex mutex;
  check_device_index(device);
  std::lock_guard<std::mutex> lock(mutex);
  CachingAllocator*& a = allocators[static_cast<size_t>(device)];
  if (a == nullptr) a = new CachingAllocator(device);  // intentionally never deleted (see the header)
  return *a;
}

MemoryStats memory_stats(int device) { return allocator_for(device).stats(); }
void reset_peak_memory_stats(int device) { allocator_for(device).reset_peak(); }
void empty_cache(int device) { allocator_for(device).empty_cache(); }

}  // namespace cpf::cuda
