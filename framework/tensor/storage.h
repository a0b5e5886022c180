#pragma once
// Storage: one allocation on one device, shared by a tensor and all its views. It also carries the
// version counter that autograd uses to detect in-place changes to saved tensors (views share it,
// because writing through a view changes the base).
//
// Memory comes from the DeviceBackend registered for the device type: the CPU backend is built in;
// the CUDA backend registers itself when compiled (framework/tensor/cuda). Nothing here assumes CPU.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "framework/tensor/device.h"

namespace cpf {

// What a device type must provide to hold tensors. Implementations are process-wide singletons.
class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  virtual void* allocate(size_t nbytes, Device device) = 0;
  virtual void deallocate(void* ptr, size_t nbytes, Device device) noexcept = 0;
  // Copies between this backend's device and the host, or within the device.
  virtual void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) = 0;
  virtual void fill_zero(void* ptr, size_t nbytes, Device device) = 0;
  virtual int device_count() const = 0;

  // Streams of work (framework/tensor/device_stream.h). A device that runs everything in order, as the
  // CPU does, keeps these defaults: one stream (the null handle), and nothing to wait for or record.
  // A new stream, owned by the returned pointer (its handle is the pointer's get()), or null.
  virtual std::shared_ptr<void> create_stream(Device device) { return nullptr; }
  // The calling thread's current stream of `device`, and making one current (null: the default).
  virtual void* current_stream(Device device) { return nullptr; }
  virtual void set_current_stream(Device device, void* stream) {}
  // Work queued on `waiter` from now on starts after the work queued on `waited` so far.
  virtual void stream_wait(Device device, void* waiter, void* waited) {}
  // Blocks the host until the work queued on `stream` so far is done.
  virtual void stream_synchronize(Device device, void* stream) {}
  // The memory at `ptr` (a live allocation) is used by work queued on `stream`: the allocator must not
  // hand it out again before that work is done.
  virtual void record_stream_use(void* ptr, Device device, void* stream) {}

  // Graphs of device work (framework/tensor/device_graph.h). capture_graph runs `body` with a capture
  // stream current and returns the replayable graph (owned by the pointer), or throws with the reason.
  virtual bool graphs_supported() const { return false; }
  virtual std::shared_ptr<void> capture_graph(Device device, const std::function<void()>& body) { return nullptr; }
  virtual void replay_graph(Device device, void* graph) {}
};

void register_device_backend(DeviceType type, DeviceBackend* backend);
// Throws with a hint when the backend is missing (e.g. cuda in a CPU-only build).
DeviceBackend& device_backend(DeviceType type);
bool has_device_backend(DeviceType type);

class Storage {
 public:
  Storage(size_t nbytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const noexcept { return data_; }
  size_t nbytes() const noexcept { return nbytes_; }
  Device device() const noexcept { return device_; }

  uint64_t version() const noexcept { return version_.load(std::memory_order_relaxed); }
  // Atomic: rank threads may write one storage (collectives into a shared buffer).
  void bump_version() noexcept { version_.fetch_add(1, std::memory_order_relaxed); }
  // A storage that takes over another's role (a ZeRO-3 parameter gathered again into fresh memory) continues
  // its version, so a saved tensor's check sees a change only when the values changed.
  void set_version(uint64_t version) noexcept { version_.store(version, std::memory_order_relaxed); }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  std::atomic<uint64_t> version_{0};
};

}  // namespace cpf
