// The DeviceBackend for DeviceType::cuda (memory through the caching allocator, byte copies between
// host and devices) and the registration that runs when cpf_tensor_cuda is linked.
#include <array>
#include <cstring>
#include <mutex>

#include "framework/tensor/cuda/allocator.cuh"
#include "framework/tensor/cuda/cuda.h"
#include "framework/tensor/cuda/cuda_ops.cuh"
#include "framework/tensor/cuda/device_errors.cuh"
#include "framework/tensor/cuda/graph_capture.cuh"
#include "framework/tensor/cuda/host_sync.cuh"
#include "framework/tensor/cuda/runtime.cuh"
#include "framework/tensor/cuda/upload_ring.cuh"
#include "framework/tensor/storage.h"

namespace cpf::cuda {
namespace {

// Host copies at least this large go through pinned staging buffers (see Staging).
constexpr size_t kStagingThreshold = size_t(1) << 20;
constexpr size_t kStagingChunk = size_t(8) << 20;
static_assert(kStagingThreshold <= kUploadRingMaxCopy, "smaller uploads go through the ring");

// Waits (counted, host_sync.cuh) for a staging buffer's previous DMA when it is still queued.
void wait_for_room(cudaEvent_t done) {
  const cudaError_t status = cudaEventQuery(done);
  if (status == cudaSuccess) return;
  if (status != cudaErrorNotReady) CPF_CUDA_CHECK(status);
  (void)cudaGetLastError();
  count_host_sync(HostSyncKind::upload_waits);
  CPF_CUDA_CHECK(cudaEventSynchronize(done));
}

// Two pinned host buffers per device. A large host<->device copy is cut into chunks that alternate
// between them, so the host-side memcpy of one chunk overlaps the DMA of the other, and the DMA runs
// at pinned-memory speed instead of through the driver's own (synchronous) pageable path. An event
// per buffer says when its last DMA is done.
class Staging {
 public:
  explicit Staging(int device) : device_(device) {}

  void to_device(void* dst, const void* src, size_t nbytes, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    init();
    const char* in = static_cast<const char*>(src);
    char* out = static_cast<char*>(dst);
    for (size_t off = 0, i = 0; off < nbytes; off += kStagingChunk, ++i) {
      const size_t len = std::min(kStagingChunk, nbytes - off);
      const size_t b = i % 2;
      wait_for_room(done_[b]);  // the buffer's previous DMA has finished
      std::memcpy(buffer_[b], in + off, len);
      CPF_CUDA_CHECK(cudaMemcpyAsync(out + off, buffer_[b], len, cudaMemcpyHostToDevice, stream));
      CPF_CUDA_CHECK(cudaEventRecord(done_[b], stream));
    }
    // The source has been read entirely: the caller may reuse it while the last DMAs complete.
  }

  void to_host(void* dst, const void* src, size_t nbytes, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    init();
    const char* in = static_cast<const char*>(src);
    char* out = static_cast<char*>(dst);
    const size_t chunks = (nbytes + kStagingChunk - 1) / kStagingChunk;
    auto chunk_len = [&](size_t i) { return std::min(kStagingChunk, nbytes - i * kStagingChunk); };
    auto start = [&](size_t i) {
      const size_t b = i % 2;
      CPF_CUDA_CHECK(cudaEventSynchronize(done_[b]));  // an earlier copy (maybe on another stream) may still read it
      CPF_CUDA_CHECK(cudaMemcpyAsync(buffer_[b], in + i * kStagingChunk, chunk_len(i), cudaMemcpyDeviceToHost, stream));
      CPF_CUDA_CHECK(cudaEventRecord(done_[b], stream));
    };
    start(0);
    for (size_t i = 0; i < chunks; ++i) {
      if (i + 1 < chunks) start(i + 1);  // the next DMA runs while this chunk is copied out
      const size_t b = i % 2;
      CPF_CUDA_CHECK(cudaEventSynchronize(done_[b]));
      std::memcpy(out + i * kStagingChunk, buffer_[b], chunk_len(i));
    }
  }

 private:
  void init() {
    if (buffer_[0] != nullptr) return;
    for (int b = 0; b < 2; ++b) {
      CPF_CUDA_CHECK(cudaHostAlloc(&buffer_[b], kStagingChunk, cudaHostAllocPortable));
      CPF_CUDA_CHECK(cudaEventCreateWithFlags(&done_[b], cudaEventDisableTiming));
    }
  }

  int device_;
  std::mutex mutex_;
  std::array<void*, 2> buffer_{};
  std::array<cudaEvent_t, 2> done_{};
};

Staging& staging_for(int device) {
  static std::array<Staging*, kMaxDevices> staging{};
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  Staging*& s = staging[static_cast<size_t>(device)];
  if (s == nullptr) s = new Staging(device);  // never deleted: pinned memory is reclaimed at exit
  return *s;
}

class CudaBackend final : public DeviceBackend {
 public:
  void* allocate(size_t nbytes, Device device) override {
    check_device_index(device.index);
    if (nbytes == 0) return nullptr;
    return allocator_for(device.index).allocate(nbytes, current_cuda_stream(device.index));
  }

  void deallocate(void* ptr, size_t, Device device) noexcept override {
    if (ptr == nullptr || device.index < 0 || device.index >= kMaxDevices) return;
    // The allocator exists: it handed out ptr.
    try {
      allocator_for(device.index).free(ptr);
    } catch (...) {
    }
  }

  void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) override {
    if (nbytes == 0) return;
    if (dst_device.is_cuda()) check_device_index(dst_device.index);
    if (src_device.is_cuda()) check_device_index(src_device.index);
    if (dst_device.is_cuda() && src_device.is_cuda()) {
      DeviceGuard guard(src_device.index);
      cudaStream_t stream = current_cuda_stream(src_device.index);
      if (dst_device == src_device) {
        CPF_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, stream));
      } else {
        // Between GPUs the destination's streams know nothing of this copy: finish it here.
        CPF_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_device.index, src, src_device.index, nbytes, stream));
        count_host_sync(HostSyncKind::stream_sync);
        CPF_CUDA_CHECK(cudaStreamSynchronize(stream));
      }
      return;
    }
    if (dst_device.is_cuda()) {  // host -> device
      DeviceGuard guard(dst_device.index);
      cudaStream_t stream = current_cuda_stream(dst_device.index);
      if (CaptureUploads* uploads = active_capture_uploads()) {
        // A graph being captured: its replays copy the bytes of now, from pinned memory the graph owns.
        CPF_CUDA_CHECK(cudaMemcpyAsync(dst, uploads->keep(src, nbytes), nbytes, cudaMemcpyHostToDevice, stream));
        return;
      }
      if (nbytes >= kStagingThreshold) {
        staging_for(dst_device.index).to_device(dst, src, nbytes, stream);
      } else {
        // Through pinned memory: a pageable source would let the driver wait for the stream.
        ring_upload(dst_device.index, dst, src, nbytes, stream);
      }
      return;
    }
    if (src_device.is_cuda()) {  // device -> host: complete when this returns
      DeviceGuard guard(src_device.index);
      count_host_sync(HostSyncKind::device_to_host);
      cudaStream_t stream = current_cuda_stream(src_device.index);
      if (nbytes >= kStagingThreshold) {
        staging_for(src_device.index).to_host(dst, src, nbytes, stream);
      } else {
        CPF_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, stream));
        CPF_CUDA_CHECK(cudaStreamSynchronize(stream));
      }
      // The host has waited for this stream: report an index error its earlier kernels found.
      raise_device_errors(src_device.index);
      return;
    }
    std::memcpy(dst, src, nbytes);
  }

  void fill_zero(void* ptr, size_t nbytes, Device device) override {
    if (nbytes == 0) return;
    check_device_index(device.index);
    DeviceGuard guard(device.index);
    CPF_CUDA_CHECK(cudaMemsetAsync(ptr, 0, nbytes, current_cuda_stream(device.index)));
  }

  int device_count() const override { return cuda::device_count(); }

  bool graphs_supported() const override { return true; }
  std::shared_ptr<void> capture_graph(Device device, const std::function<void()>& body) override {
    check_device_index(device.index);
    return cuda::capture_graph(device.index, body);
  }
  void replay_graph(Device device, void* graph) override {
    check_device_index(device.index);
    cuda::replay_graph(device.index, graph);
  }

  std::shared_ptr<void> create_stream(Device device) override {
    auto stream = std::make_shared<Stream>(Stream::create(device.index));
    return std::shared_ptr<void>(stream, stream->handle());  // aliasing: get() is the cudaStream_t
  }
  void* current_stream(Device device) override {
    check_device_index(device.index);
    return current_cuda_stream(device.index);
  }
  void set_current_stream(Device device, void* stream) override {
    set_current_cuda_stream(device.index, static_cast<cudaStream_t>(stream));
  }
  void stream_wait(Device device, void* waiter, void* waited) override {
    check_device_index(device.index);
    DeviceGuard guard(device.index);
    cudaEvent_t event = nullptr;
    CPF_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    const cudaError_t recorded = cudaEventRecord(event, static_cast<cudaStream_t>(waited));
    const cudaError_t waited_on =
        recorded == cudaSuccess ? cudaStreamWaitEvent(static_cast<cudaStream_t>(waiter), event, 0) : recorded;
    (void)cudaEventDestroy(event);  // legal at once: the wait keeps what it needs
    CPF_CUDA_CHECK(waited_on);
  }
  void stream_synchronize(Device device, void* stream) override {
    check_device_index(device.index);
    DeviceGuard guard(device.index);
    count_host_sync(HostSyncKind::stream_sync);
    CPF_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
    raise_device_errors(device.index);
  }
  void record_stream_use(void* ptr, Device device, void* stream) override {
    allocator_for(device.index).record_stream(ptr, static_cast<cudaStream_t>(stream));
  }
};

}  // namespace

void register_profile_hooks();  // profile_hooks.cpp

void register_backend() {
  static CudaBackend* backend = new CudaBackend;  // process lifetime: storages may outlive main()
  register_profile_hooks();
  register_device_backend(DeviceType::cuda, backend);
  register_device_ops(DeviceType::cuda, &cuda_device_ops());
}

}  // namespace cpf::cuda

// Linking cpf_tensor_cuda adds -Wl,--undefined=cpf_tensor_cuda_register (CMake INTERFACE link option),
// which makes the linker take this object out of the static archive even though nothing calls into
// it; its static initialiser below then registers the backend before main(). Registering touches no
// CUDA API, so it is harmless on machines without a GPU.
extern "C" void cpf_tensor_cuda_register() { cpf::cuda::register_backend(); }

namespace {
const bool g_registered = (cpf_tensor_cuda_register(), true);
}  // namespace
