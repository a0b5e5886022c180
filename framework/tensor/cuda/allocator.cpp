#include "framework/tensor/cuda/allocator.cuh"

#include <algorithm>
#include <array>
#include <bit>
#include <iomanip>
#include <optional>
#include <sstream>

#include "framework/tensor/cuda/device_errors.cuh"
#include "framework/tensor/cuda/graph_capture.cuh"
#include "framework/tensor/cuda/host_sync.cuh"
#include "framework/tensor/cuda/runtime.cuh"
#include "framework/tensor/profile.h"
#include "framework/tensor/storage.h"

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

void* CachingAllocator::device_malloc_locked(size_t size, size_t nbytes) {
  DeviceGuard guard(device_);
  count_host_sync(HostSyncKind::device_malloc);
  void* ptr = nullptr;
  cudaError_t status = cudaMalloc(&ptr, size);
  // A capture forbids the device synchronisation the release needs (it would fail and end the capture
  // with a misleading reason): out-of-memory is reported at once, and the capture fails with it.
  const bool capturing = any_capturing_locked();
  if (status == cudaErrorMemoryAllocation && !capturing) {
    (void)cudaGetLastError();
    // Cached blocks may still be in use by queued kernels of their streams: wait, then release.
    count_host_sync(HostSyncKind::device_sync);
    CPF_CUDA_CHECK(cudaDeviceSynchronize());
    collect_pending_locked();
    release_cached_locked();
    status = cudaMalloc(&ptr, size);
  }
  if (status == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    (void)cudaMemGetInfo(&free_bytes, &total_bytes);
    (void)cudaGetLastError();
    const std::string phase = profile::open_scopes();
    CPF_FAIL("cuda:", device_, " out of memory", phase.empty() ? "" : " in " + phase, ": tried to allocate ",
             bytes_str(size), " (", nbytes, " bytes requested); allocated ", bytes_str(stats_.allocated), ", reserved ",
             bytes_str(stats_.reserved), ", peak allocated ", bytes_str(stats_.peak_allocated), "; the device has ",
             bytes_str(free_bytes), " free of ", bytes_str(total_bytes),
             capturing ? " (during a CUDA-graph capture: the cached blocks were not released, since that needs a "
                         "device synchronisation)"
                       : "");
  }
  CPF_CUDA_CHECK(status);
  ++stats_.device_mallocs;
  stats_.reserved += size;
  stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
  return ptr;
}

CachingAllocator::Pool* CachingAllocator::capturing_pool_locked(cudaStream_t stream, int* id) {
  for (auto& [pool_id, pool] : pools_) {
    if (pool.capturing && pool.stream == stream) {
      *id = pool_id;
      return &pool;
    }
  }
  return nullptr;
}

bool CachingAllocator::any_capturing_locked() const {
  return std::any_of(pools_.begin(), pools_.end(), [](const auto& entry) { return entry.second.capturing; });
}

void CachingAllocator::check_not_forked_capture_locked(cudaStream_t stream) const {
  // The thread running a capture allocates on its capture stream only: a block for another stream (one the
  // body forked into the capture, or one whose work runs outside it) would come from the ordinary cache,
  // which hands it out again while the graph still uses it.
  CPF_CHECK(active_capture_uploads() == nullptr, "cuda:", device_, ": an allocation on stream ", stream,
            " while this thread captures a CUDA graph on another stream (a stream the capture forked, or one "
            "outside it): its block would join the ordinary cache while the graph still uses it; allocate on "
            "the capture stream");
  // Other threads: a stream of theirs that takes part in a capture. The legacy stream never does here
  // (the capture streams are non-blocking).
  if (stream == nullptr) return;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t queried = cudaStreamIsCapturing(stream, &status);
  (void)cudaGetLastError();
  CPF_CHECK(queried != cudaSuccess || status == cudaStreamCaptureStatusNone, "cuda:", device_,
            ": an allocation on stream ", stream,
            ", which a CUDA-graph capture forked from its own stream: the block would join the ordinary cache "
            "while the graph still uses it (allocate on the capture stream, before switching streams)");
}

void* CachingAllocator::allocate(size_t nbytes, cudaStream_t stream) {
  if (nbytes == 0) return nullptr;
  const size_t size = round_size(nbytes);
  std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.allocations;
  if (!pending_.empty()) collect_pending_locked();
  void* ptr = nullptr;
  int pool_id = 0;
  Pool* pool = capturing_pool_locked(stream, &pool_id);
  if (pool == nullptr && any_capturing_locked()) check_not_forked_capture_locked(stream);
  std::vector<void*>* cached = nullptr;
  if (pool != nullptr) {
    if (auto it = pool->free.find(size); it != pool->free.end()) cached = &it->second;
  } else if (auto it = free_.find({stream, size}); it != free_.end()) {
    cached = &it->second;
  }
  if (cached != nullptr && !cached->empty()) {
    ptr = cached->back();
    cached->pop_back();
    ++stats_.cache_hits;
  } else {
    ptr = device_malloc_locked(size, nbytes);
  }
  active_[ptr] = Block{size, stream, {}, pool_id};
  if (pool != nullptr) ++pool->live;
  stats_.allocated += size;
  stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
  return ptr;
}

void CachingAllocator::free(void* ptr) noexcept {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = active_.find(ptr);
  if (it == active_.end()) return;
  const Block block = std::move(it->second);
  active_.erase(it);
  stats_.allocated -= block.size;
  if (block.pool != 0) {
    // A capture pool's block: reused only while that capture runs (its graph keeps the address), and not
    // even then when other streams used it (the graph does not order their work before the new owner's).
    if (auto pool = pools_.find(block.pool); pool != pools_.end()) {
      try {
        Pool& p = pool->second;
        --p.live;
        if (block.used_on.empty()) {
          p.free[block.size].push_back(ptr);
        } else {
          p.parked.emplace_back(ptr, block.size);
        }
        return;
      } catch (...) {
        // Out of host memory: the block stays reserved, unreachable, until the process ends.
        return;
      }
    }
  }
  try {
    if (!block.used_on.empty()) {
      // Other streams may still have work queued on the block: wait for events recorded on them now.
      Pending pending{ptr, block.size, block.stream, {}};
      DeviceGuard guard(device_);
      for (cudaStream_t s : block.used_on) {
        cudaEvent_t event = take_event_locked();
        if (cudaEventRecord(event, s) == cudaSuccess) {
          pending.events.push_back(event);
        } else {
          // The stream was destroyed, which drained it first: it no longer uses the block.
          (void)cudaGetLastError();
          spare_events_.push_back(event);
        }
      }
      if (!pending.events.empty()) {
        pending_.push_back(std::move(pending));
        return;
      }
    }
    free_[{block.stream, block.size}].push_back(ptr);
  } catch (...) {
    // Out of host memory or events: give the block back to the driver instead of caching it (cudaFree
    // waits for the device, so no stream still uses it).
    count_host_sync(HostSyncKind::device_malloc);
    if (cudaFree(ptr) == cudaSuccess) {
      stats_.reserved -= block.size;
      ++stats_.device_frees;
    }
    (void)cudaGetLastError();
  }
}

void CachingAllocator::record_stream(void* ptr, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = active_.find(ptr);
  CPF_CHECK(it != active_.end(),
            "record_stream: the tensor's storage was not allocated by the caching allocator of cuda:", device_);
  Block& block = it->second;
  if (stream == block.stream) return;  // stream order already protects it
  for (cudaStream_t s : block.used_on) {
    if (s == stream) return;
  }
  block.used_on.push_back(stream);
}

cudaEvent_t CachingAllocator::take_event_locked() {
  if (!spare_events_.empty()) {
    cudaEvent_t event = spare_events_.back();
    spare_events_.pop_back();
    return event;
  }
  cudaEvent_t event = nullptr;
  CPF_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  return event;
}

void CachingAllocator::collect_pending_locked() {
  DeviceGuard guard(device_);
  std::vector<Pending> waiting;
  for (Pending& p : pending_) {
    bool done = true;
    for (cudaEvent_t event : p.events) {
      const cudaError_t status = cudaEventQuery(event);
      if (status == cudaErrorNotReady) {
        done = false;
        break;
      }
      // Any other failure is a broken context, reported by the next checked call: treat as done.
      if (status != cudaSuccess) (void)cudaGetLastError();
    }
    if (!done) {
      waiting.push_back(std::move(p));
      continue;
    }
    spare_events_.insert(spare_events_.end(), p.events.begin(), p.events.end());
    free_[{p.stream, p.size}].push_back(p.ptr);
  }
  pending_ = std::move(waiting);
}

void CachingAllocator::release_cached_locked() {
  for (auto& [key, ptrs] : free_) {
    for (void* p : ptrs) {
      count_host_sync(HostSyncKind::device_malloc);
      CPF_CUDA_CHECK(cudaFree(p));
      stats_.reserved -= key.second;
      ++stats_.device_frees;
    }
  }
  free_.clear();
  // Released pools: their graphs are gone and the caller synchronised, so no replay uses their blocks.
  for (auto it = pools_.begin(); it != pools_.end();) {
    if (!it->second.released) {
      ++it;
      continue;
    }
    free_pool_blocks_locked(it->second);
    it = it->second.live == 0 ? pools_.erase(it) : std::next(it);
  }
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  DeviceGuard guard(device_);
  count_host_sync(HostSyncKind::device_sync);
  CPF_CUDA_CHECK(cudaDeviceSynchronize());
  collect_pending_locked();  // every event has completed
  release_cached_locked();
}

int CachingAllocator::begin_pool(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  int id = 0;
  CPF_CHECK(capturing_pool_locked(stream, &id) == nullptr, "cuda:", device_, ": stream ", stream,
            " already captures into pool ", id, " (one capture per stream at a time)");
  id = next_pool_++;
  Pool pool;
  pool.stream = stream;
  pools_[id] = std::move(pool);
  return id;
}

void CachingAllocator::end_pool_capture(int id) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto pool = pools_.find(id); pool != pools_.end()) pool->second.capturing = false;
}

void CachingAllocator::free_pool_blocks_locked(Pool& pool) noexcept {
  std::optional<DeviceGuard> guard;
  try {
    guard.emplace(device_);
  } catch (...) {
    // Never throws: in a context broken by a fault, or torn down at exit, the frees below fail quietly.
  }
  const auto give_back = [&](void* p, size_t size) {
    count_host_sync(HostSyncKind::device_malloc);
    if (cudaFree(p) == cudaSuccess) {
      stats_.reserved -= size;
      ++stats_.device_frees;
    }
    (void)cudaGetLastError();
  };
  for (auto& [size, ptrs] : pool.free) {
    for (void* p : ptrs) give_back(p, size);
  }
  for (const auto& [p, size] : pool.parked) give_back(p, size);
  pool.free.clear();
  pool.parked.clear();
}

void CachingAllocator::release_pool(int id) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  auto pool = pools_.find(id);
  if (pool == pools_.end()) return;
  pool->second.capturing = false;
  free_pool_blocks_locked(pool->second);
  // Live blocks keep the pool: freed later, they wait in it for the next release of the cache (a block
  // put in the ordinary cache would be keyed by the capture stream, whose handle a new stream may get,
  // while the replays used it on the caller's streams).
  if (pool->second.live == 0) {
    pools_.erase(pool);
  } else {
    pool->second.released = true;
  }
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

void record_stream(const Tensor& tensor, const Stream& stream) {
  CPF_CHECK(tensor.defined(), "record_stream: the tensor is undefined");
  CPF_CHECK(tensor.device().is_cuda() && tensor.device().index == stream.device(), "record_stream: the tensor is on ",
            tensor.device(), " but the stream belongs to cuda:", stream.device(),
            " (a tensor can only be marked for a stream of its device)");
  const auto& storage = tensor.storage();
  if (storage == nullptr || storage->data() == nullptr) return;  // no memory (an empty tensor)
  allocator_for(stream.device()).record_stream(storage->data(), static_cast<cudaStream_t>(stream.handle()));
}

size_t total_memory(int device) {
  DeviceGuard guard(device);
  size_t free_bytes = 0, total_bytes = 0;
  CPF_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return total_bytes;
}

MemoryStats memory_stats(int device) {
  MemoryStats stats = allocator_for(device).stats();
  raise_device_errors(device);  // a cheap host read; reports index errors of finished checks
  return stats;
}
void reset_peak_memory_stats(int device) { allocator_for(device).reset_peak(); }
void empty_cache(int device) {
  allocator_for(device).empty_cache();
  raise_device_errors(device);  // empty_cache waited for the device
}

}  // namespace cpf::cuda
