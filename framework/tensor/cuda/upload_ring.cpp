#include "framework/tensor/cuda/upload_ring.cuh"

#include <array>
#include <cstring>
#include <deque>
#include <mutex>
#include <vector>

#include "framework/tensor/cuda/cuda_check.cuh"
#include "framework/tensor/cuda/host_sync.cuh"
#include "framework/tensor/cuda/runtime.cuh"

namespace cpf::cuda {
namespace {

class UploadRing {
 public:
  void upload(void* dst, const void* src, size_t nbytes, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (buffer_ == nullptr) CPF_CUDA_CHECK(cudaHostAlloc(&buffer_, kUploadRingBytes, cudaHostAllocPortable));
    const size_t n = (nbytes + 255) / 256 * 256;  // regions stay 256-byte aligned
    if (head_ + n > kUploadRingBytes) head_ = 0;  // the tail is left unused until the next lap
    release_completed();
    // In ring order the oldest regions lie just ahead of the head: wait for those the new one covers.
    while (!in_flight_.empty() && overlaps(in_flight_.front(), head_, head_ + n)) {
      count_host_sync(HostSyncKind::upload_waits);
      CPF_CUDA_CHECK(cudaEventSynchronize(in_flight_.front().done));
      retire_front();
    }
    char* slot = static_cast<char*>(buffer_) + head_;
    std::memcpy(slot, src, nbytes);
    CPF_CUDA_CHECK(cudaMemcpyAsync(dst, slot, nbytes, cudaMemcpyHostToDevice, stream));
    const cudaEvent_t done = take_event();
    CPF_CUDA_CHECK(cudaEventRecord(done, stream));
    in_flight_.push_back(Region{head_, head_ + n, done});
    head_ += n;
  }

 private:
  struct Region {
    size_t begin = 0, end = 0;
    cudaEvent_t done = nullptr;
  };

  static bool overlaps(const Region& r, size_t begin, size_t end) { return r.begin < end && begin < r.end; }

  // Regions whose DMA has finished, oldest first (no waiting: cudaEventQuery).
  void release_completed() {
    while (!in_flight_.empty()) {
      const cudaError_t status = cudaEventQuery(in_flight_.front().done);
      if (status == cudaErrorNotReady) {
        (void)cudaGetLastError();
        return;
      }
      CPF_CUDA_CHECK(status);
      retire_front();
    }
  }

  void retire_front() {
    spare_events_.push_back(in_flight_.front().done);
    in_flight_.pop_front();
  }

  cudaEvent_t take_event() {
    if (!spare_events_.empty()) {
      const cudaEvent_t e = spare_events_.back();
      spare_events_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    CPF_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }

  std::mutex mutex_;
  void* buffer_ = nullptr;  // pinned; never freed (reclaimed at exit), like the staging buffers
  size_t head_ = 0;
  std::deque<Region> in_flight_;
  std::vector<cudaEvent_t> spare_events_;
};

UploadRing& ring_for(int device) {
  static std::array<UploadRing*, kMaxDevices> rings{};
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  UploadRing*& r = rings[static_cast<size_t>(device)];
  if (r == nullptr) r = new UploadRing;  // process lifetime
  return *r;
}

}  // namespace

void ring_upload(int device, void* dst, const void* src, size_t nbytes, cudaStream_t stream) {
  ring_for(device).upload(dst, src, nbytes, stream);
}

}  // namespace cpf::cuda
