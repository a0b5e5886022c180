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
//
// Cross-stream use (record_stream): a block marked as used on other streams gets, when freed, an
// event recorded on each of them and waits in a pending list; it joins its free list only once every
// event has completed (polled at each allocation, without blocking), so no allocation on the block's
// stream can be handed memory that another stream's queued kernels still read or write.
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
  // Marks the block at `ptr` (a pointer allocate() returned) as used on `stream` too.
  void record_stream(void* ptr, cudaStream_t stream);
  void empty_cache();
  MemoryStats stats();
  void reset_peak();

  // The size class `nbytes` is served from.
  static size_t round_size(size_t nbytes);

  // Private pools for CUDA-graph capture (graph_capture.cpp). While pool `id` captures on `stream`, every
  // allocation on that stream comes from it, and a block freed into it is reused only by that capture (in
  // its stream order, which the graph keeps; a block marked with record_stream is never reused, since the
  // graph orders only the capture stream's own work after it). Once the capture ends the pool hands nothing
  // out: the addresses a graph captured stay its own while the pool lives, whoever frees them meanwhile.
  // While a capture runs, an allocation on another stream by the capturing thread, or on a stream that
  // takes part in a capture (one the body forked), throws: its block would join the ordinary cache while
  // the graph still uses it. And an allocation that finds the device full does not release the cache (that
  // needs a device synchronisation, which a capture forbids): it reports out-of-memory at once.
  int begin_pool(cudaStream_t stream);
  void end_pool_capture(int id);
  // The graph is gone and the caller has synchronised the device: the pool's free blocks go back to the
  // driver. Its live blocks (tensors the graph made that are still held) stay the pool's: freed later,
  // they wait in it (their last use may be on any stream that replayed the graph) until the next
  // release of the cache (empty_cache, or an allocation that finds the device full), which synchronises
  // first and returns them to the driver.
  void release_pool(int id) noexcept;

 private:
  struct Block {
    size_t size = 0;
    cudaStream_t stream = nullptr;
    std::vector<cudaStream_t> used_on;  // other streams (record_stream)
    int pool = 0;                       // 0: the ordinary cache; else a capture pool's id
  };
  struct Pool {
    cudaStream_t stream = nullptr;
    bool capturing = true;
    bool released = false;                         // the graph is gone (release_pool); live blocks remain
    size_t live = 0;                               // blocks allocated from the pool and not yet freed
    std::map<size_t, std::vector<void*>> free;     // by size class
    std::vector<std::pair<void*, size_t>> parked;  // freed with record_stream marks: never reused
  };
  using PoolKey = std::pair<cudaStream_t, size_t>;
  // A freed block still in use by other streams until its events complete.
  struct Pending {
    void* ptr = nullptr;
    size_t size = 0;
    cudaStream_t stream = nullptr;
    std::vector<cudaEvent_t> events;
  };

  // Moves pending blocks whose events have all completed to their free lists (the caller holds mutex_).
  void collect_pending_locked();
  // Releases every cached block (released capture pools' included, and those pools once no block of
  // theirs is live); the caller holds mutex_ and has synchronised the device.
  void release_cached_locked();
  cudaEvent_t take_event_locked();
  // A new block of `size` bytes from the driver (after releasing the cache once when it is full).
  void* device_malloc_locked(size_t size, size_t nbytes);
  // The capture pool allocating on `stream`, or null.
  Pool* capturing_pool_locked(cudaStream_t stream, int* id);
  bool any_capturing_locked() const;
  // Throws when `stream` (not a pool's capture stream) is used by the thread running a capture, or takes
  // part in a running capture.
  void check_not_forked_capture_locked(cudaStream_t stream) const;
  // Returns the pool's cached blocks to the driver (the caller holds mutex_ and has synchronised).
  void free_pool_blocks_locked(Pool& pool) noexcept;

  int device_;
  std::mutex mutex_;
  std::unordered_map<void*, Block> active_;
  std::map<PoolKey, std::vector<void*>> free_;
  std::vector<Pending> pending_;
  std::vector<cudaEvent_t> spare_events_;
  std::map<int, Pool> pools_;
  int next_pool_ = 1;
  MemoryStats stats_;
};

// The allocator of `device` (created on first use, never destroyed: blocks outlive static
// destruction order, and the driver reclaims them at exit).
CachingAllocator& allocator_for(int device);

}  // namespace cpf::cuda
