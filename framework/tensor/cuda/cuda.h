#pragma once
// Public API of the CUDA backend (library cpf_tensor_cuda, built when CUDA is enabled). No CUDA header
// is included: streams are opaque handles, so code using this compiles with any C++ compiler.
//
// Linking cpf_tensor_cuda is all it takes to get cuda tensors: the library carries a link option
// (-Wl,--undefined=cpf_tensor_cuda_register) that forces the object holding its static initialiser
// out of the static archive, and that initialiser registers the DeviceBackend for DeviceType::cuda and
// the device kernel table (framework/tensor/device_ops.h). No CUDA call happens before the first use,
// so programs linked with it run unchanged on machines without a GPU.
//
// Memory: a caching allocator per device. Freed blocks stay cached, keyed by the stream they were
// allocated on, and are reused by later allocations of the same size class on that stream (stream
// order makes that safe without events), so a training loop does no cudaMalloc/cudaFree once warm.
// A tensor used on another stream than the one it was allocated on is either kept alive by the caller
// until that stream's work on it is done, or marked with record_stream(tensor, stream): its block is then
// not reused before the work queued on that stream up to the tensor's release has completed.
//
// Errors: index values (embedding ids, cross-entropy targets, index/gather/scatter indices) are checked on
// the device without waiting for it; a bad one is reported, with the CPU's message, by the next call that
// waits for the device anyway (a device->host copy such as item() or to_vector(), synchronize,
// Stream::synchronize, memory_stats, empty_cache). CPF_CUDA_SYNC=1 in the environment (or
// set_sync_debug(true)) synchronises after every kernel launch, so a fault or a bad index is reported by
// the op that launched the kernel.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "framework/tensor/tensor.h"

namespace cpf::cuda {

// Registers the backend and the kernels; idempotent, and already done when the library is linked.
void register_backend();

// Number of visible CUDA devices; 0 when there is no GPU or no driver (never throws).
int device_count();
inline bool is_available() { return device_count() > 0; }
// The device's marketing name (cudaDeviceProp::name, e.g. "NVIDIA H100 80GB HBM3").
std::string device_name(int device = 0);

struct MemoryStats {
  size_t allocated = 0;       // bytes in blocks handed out to tensors (size-class rounded)
  size_t reserved = 0;        // bytes held from cudaMalloc (allocated + cached)
  size_t peak_allocated = 0;  // since the start or the last reset_peak_memory_stats
  size_t peak_reserved = 0;
  uint64_t allocations = 0;     // allocate() calls for a non-zero size
  uint64_t cache_hits = 0;      // of those, served from the cache
  uint64_t device_mallocs = 0;  // cudaMalloc calls
  uint64_t device_frees = 0;    // cudaFree calls
};
MemoryStats memory_stats(int device = 0);
void reset_peak_memory_stats(int device = 0);
// The device's whole memory in bytes (cudaMemGetInfo's total): what the memory planner compares with.
size_t total_memory(int device = 0);
// Waits for the device, then returns every cached (unused) block to the driver.
void empty_cache(int device = 0);

// Each host thread has a current stream per device: the default (legacy) stream until set. Kernels,
// copies and allocations of a thread go to its current stream, so rank threads sharing a GPU run
// concurrently once each sets its own.
class Stream {
 public:
  // A new non-blocking stream, destroyed (after it drains) with the last Stream that owns it.
  static Stream create(int device = 0);
  static Stream default_stream(int device = 0);

  void* handle() const { return handle_; }  // the cudaStream_t; nullptr for the default stream
  int device() const { return device_; }
  void synchronize() const;
  friend bool operator==(const Stream& a, const Stream& b) { return a.handle_ == b.handle_ && a.device_ == b.device_; }

 private:
  friend Stream current_stream(int device);
  Stream(void* handle, int device, std::shared_ptr<void> owner)
      : handle_(handle), device_(device), owner_(std::move(owner)) {}
  void* handle_ = nullptr;
  int device_ = 0;
  std::shared_ptr<void> owner_;  // keeps a created stream alive; null for views and the default stream
};

// This thread's current stream on `device`, as a non-owning view.
Stream current_stream(int device = 0);

// Makes `stream` current for its device on this thread. The caller keeps it alive while current.
void set_current_stream(const Stream& stream);

// Sets a stream as current for a scope and restores the previous one.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& stream) : previous_(current_stream(stream.device())) {
    set_current_stream(stream);
  }
  ~StreamGuard() { set_current_stream(previous_); }
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream previous_;
};

// Waits for all work of every stream on the device.
void synchronize(int device = 0);

// Marks `tensor` (on a cuda device) as used on `stream`: when its storage is released, the caching
// allocator records an event on `stream` and reuses the block only after it has completed. Needed when a
// tensor allocated on one stream is read or written by kernels queued on another and may be released
// before that stream is done. The stream must stay alive until the tensor is released (a destroyed
// Stream drains first, so that case is safe too).
void record_stream(const Tensor& tensor, const Stream& stream);

// Throws, with the CPU's message, an index error that a device-side check of `device` has recorded and
// not yet reported. Cheap (a host memory read); called by every point that waits for the device.
void check_device_errors(int device = 0);

// The synchronising debug mode: every kernel launch waits for the device and reports what failed in
// it. Initially on when the environment variable CPF_CUDA_SYNC is set to anything but "" or "0".
void set_sync_debug(bool enabled);
bool sync_debug();

// Host synchronisations made by this process's CUDA backend since it started, by kind: every point
// where the host waits for a device, or may (docs/training.md lists what a training step still does).
// A test reads the counts before and after a step and asserts the difference. Always counted.
struct HostSyncCounts {
  uint64_t device_to_host = 0;  // device->host copies (item(), to_vector(), to(cpu)): wait for the stream
  uint64_t upload_waits = 0;    // host->device copies that waited for pinned room (upload_ring.cuh)
  uint64_t stream_syncs = 0;    // stream and event synchronisations (Stream::synchronize, staging buffers)
  uint64_t device_syncs = 0;    // cuda::synchronize, empty_cache, the allocator's out-of-memory retry
  uint64_t device_mallocs = 0;  // cudaMalloc / cudaFree of the caching allocator's slow path
  uint64_t total() const { return device_to_host + upload_waits + stream_syncs + device_syncs + device_mallocs; }
};
HostSyncCounts host_sync_counts();
HostSyncCounts operator-(const HostSyncCounts& a, const HostSyncCounts& b);
std::string to_string(const HostSyncCounts& counts);  // "3 (device->host copies 2, ...)"
// CPF_SYNC_CHECK set to anything but "" or "0": the trainer logs each step's counts (docs/training.md).
bool sync_check_enabled();

// f32 matmuls may use TF32 tensor cores (inputs rounded to 10 mantissa bits, f32 accumulation).
// Off by default: f32 matmuls then match the CPU to f32 rounding. Process-wide.
void set_allow_tf32(bool allow);
bool allow_tf32();

// Whether out = a @ b [+ bias] (2-D) runs as the few-row GEMV kernel instead of cuBLASLt: a linear
// layer's forward (b the transposed view of a contiguous (N, K) weight) on at most 8 rows, f32 or bf16
// throughout, K a multiple of 16 bytes' elements, 16-byte aligned operands; a decoding step's GEMMs.
// The environment variable CPF_GEMV=0 turns the kernel off (read once), for measuring against cuBLASLt.
bool gemv_applies(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias);

}  // namespace cpf::cuda
