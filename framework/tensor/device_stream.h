#pragma once
// DeviceStream: a device-agnostic handle on a stream of device work, so code above the backends (the
// CP ring, for one) can overlap independent kernels without knowing the device type. On CUDA a
// stream is a non-blocking cudaStream_t of the thread's device; on devices that run everything in
// order (the CPU) every stream is the same empty one and each call below is a no-op, so the same
// code runs unchanged there.
//
// The rules are CUDA's: work on two streams may run concurrently; `wait_for` orders them; a tensor
// allocated while one stream was current and used by work on another must be marked with
// `record_use` before it is released, or its memory could be reused while that work still reads it.
#include <memory>

#include "framework/tensor/tensor.h"

namespace cpf {

class DeviceStream {
 public:
  // The calling thread's current stream of `device` (not owned).
  static DeviceStream current(Device device);
  // A new stream of `device`, alive as long as a DeviceStream copy of it is; on in-order devices the
  // (only) current stream.
  static DeviceStream create(Device device);

  // Work queued on this stream from now on starts after the work queued on `other` so far.
  void wait_for(const DeviceStream& other) const;
  // `tensor` (on this stream's device) is used by work queued on this stream.
  void record_use(const Tensor& tensor) const;
  // Blocks until the work queued on this stream so far is done (then any stream may use its results).
  void synchronize() const;

  Device device() const { return device_; }
  void* handle() const { return handle_; }
  // Streams that are one and the same (always, on in-order devices).
  friend bool operator==(const DeviceStream& a, const DeviceStream& b) {
    return a.device_ == b.device_ && a.handle_ == b.handle_;
  }

 private:
  DeviceStream(Device device, void* handle, std::shared_ptr<void> owner)
      : device_(device), handle_(handle), owner_(std::move(owner)) {}
  Device device_;
  void* handle_ = nullptr;
  std::shared_ptr<void> owner_;
};

// Makes `stream` the current stream of its device on this thread for a scope, then restores the
// previous one. The stream must outlive the scope.
class DeviceStreamScope {
 public:
  explicit DeviceStreamScope(const DeviceStream& stream);
  ~DeviceStreamScope();
  DeviceStreamScope(const DeviceStreamScope&) = delete;
  DeviceStreamScope& operator=(const DeviceStreamScope&) = delete;

 private:
  Device device_;
  void* previous_ = nullptr;
};

}  // namespace cpf
