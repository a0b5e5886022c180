// Devices, per-thread current streams and the Stream handle of the CUDA backend.
#include <array>
#include <atomic>
#include <mutex>

#include "framework/tensor/cuda/cuda.h"
#include "framework/tensor/cuda/device_errors.cuh"
#include "framework/tensor/cuda/host_sync.cuh"
#include "framework/tensor/cuda/runtime.cuh"

namespace cpf::cuda {

namespace detail {

void throw_cuda_error(const char* file, int line, const char* call, cudaError_t status) {
  (void)cudaGetLastError();  // clear the (non-sticky) error so later checks do not report it again
  ::cpf::detail::throw_error(
      file, line, call,
      ::cpf::str_cat("CUDA error in ", call, ": ", cudaGetErrorString(status), " (", cudaGetErrorName(status), ")"));
}

}  // namespace detail

namespace {

// The current stream of each device for this thread; nullptr is the legacy default stream.
thread_local std::array<cudaStream_t, kMaxDevices> t_current_stream{};

std::atomic<bool> g_allow_tf32{false};

}  // namespace

std::string device_name(int device) {
  CPF_CHECK(device >= 0 && device < device_count(), "cuda::device_name: no CUDA device ", device, " (", device_count(),
            " visible)");
  cudaDeviceProp prop{};
  CPF_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return prop.name;
}

int device_count() {
  // Cached: the count cannot change while the process runs. No driver or no GPU gives 0.
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return n < kMaxDevices ? n : kMaxDevices;
  }();
  return count;
}

void check_device_index(int device) {
  const int count = device_count();
  CPF_CHECK(device >= 0 && device < count, "cuda:", device, " is not available: this machine has ", count,
            " visible CUDA device", count == 1 ? "" : "s",
            count == 0 ? " (no GPU or no NVIDIA driver; check nvidia-smi and CUDA_VISIBLE_DEVICES)" : "");
}

cudaStream_t current_cuda_stream(int device) { return t_current_stream[static_cast<size_t>(device)]; }

void set_current_cuda_stream(int device, cudaStream_t stream) {
  check_device_index(device);
  t_current_stream[static_cast<size_t>(device)] = stream;
}

DeviceGuard::DeviceGuard(int device) {
  CPF_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ == device) {
    previous_ = -1;
  } else {
    CPF_CUDA_CHECK(cudaSetDevice(device));
  }
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) (void)cudaSetDevice(previous_);
}

const DeviceInfo& device_info(int device) {
  static std::array<DeviceInfo, kMaxDevices> infos{};
  static std::array<std::once_flag, kMaxDevices> once;
  check_device_index(device);
  std::call_once(once[static_cast<size_t>(device)], [device] {
    DeviceInfo& info = infos[static_cast<size_t>(device)];
    CPF_CUDA_CHECK(cudaDeviceGetAttribute(&info.sm_count, cudaDevAttrMultiProcessorCount, device));
    CPF_CUDA_CHECK(cudaDeviceGetAttribute(&info.max_threads_per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, device));
  });
  return infos[static_cast<size_t>(device)];
}

// ---- Stream ----

namespace {

struct OwnedStream {
  cudaStream_t stream = nullptr;
  int device = 0;
  ~OwnedStream() {
    // Drain first: the caching allocator may hand this stream's freed blocks to a later stream that
    // gets the same handle, which is only safe once no work of this one is pending.
    // Destructors never throw: errors are dropped.
    int previous = -1;
    (void)cudaGetDevice(&previous);
    if (cudaSetDevice(device) == cudaSuccess) {
      (void)cudaStreamSynchronize(stream);
      (void)cudaStreamDestroy(stream);
    }
    if (previous >= 0) (void)cudaSetDevice(previous);
    (void)cudaGetLastError();
  }
};

}  // namespace

Stream Stream::create(int device) {
  check_device_index(device);
  DeviceGuard guard(device);
  auto owned = std::make_shared<OwnedStream>();
  owned->device = device;
  CPF_CUDA_CHECK(cudaStreamCreateWithFlags(&owned->stream, cudaStreamNonBlocking));
  void* handle = owned->stream;
  return Stream(handle, device, std::move(owned));
}

Stream Stream::default_stream(int device) {
  check_device_index(device);
  return Stream(nullptr, device, nullptr);
}

void Stream::synchronize() const {
  DeviceGuard guard(device_);
  count_host_sync(HostSyncKind::stream_sync);
  CPF_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(handle_)));
  raise_device_errors(device_);
}

Stream current_stream(int device) {
  check_device_index(device);
  return Stream(t_current_stream[static_cast<size_t>(device)], device, nullptr);
}

void set_current_stream(const Stream& stream) {
  check_device_index(stream.device());
  t_current_stream[static_cast<size_t>(stream.device())] = static_cast<cudaStream_t>(stream.handle());
}

void synchronize(int device) {
  check_device_index(device);
  DeviceGuard guard(device);
  count_host_sync(HostSyncKind::device_sync);
  CPF_CUDA_CHECK(cudaDeviceSynchronize());
  raise_device_errors(device);
}

void set_allow_tf32(bool allow) { g_allow_tf32.store(allow, std::memory_order_relaxed); }
bool allow_tf32() { return g_allow_tf32.load(std::memory_order_relaxed); }

}  // namespace cpf::cuda
