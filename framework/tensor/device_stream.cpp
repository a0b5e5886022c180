#include "framework/tensor/device_stream.h"

#include "framework/core/error.h"
#include "framework/tensor/storage.h"

namespace cpf {

DeviceStream DeviceStream::current(Device device) {
  return DeviceStream(device, device_backend(device.type).current_stream(device), nullptr);
}

DeviceStream DeviceStream::create(Device device) {
  std::shared_ptr<void> owner = device_backend(device.type).create_stream(device);
  if (!owner) return current(device);
  void* handle = owner.get();
  return DeviceStream(device, handle, std::move(owner));
}

void DeviceStream::wait_for(const DeviceStream& other) const {
  CPF_CHECK(other.device_ == device_, "DeviceStream::wait_for: a stream of ", device_, " cannot wait for one of ",
            other.device_);
  if (other.handle_ == handle_) return;  // one stream is ordered with itself
  device_backend(device_.type).stream_wait(device_, handle_, other.handle_);
}

void DeviceStream::record_use(const Tensor& tensor) const {
  if (!tensor.defined() || tensor.storage() == nullptr || tensor.storage()->data() == nullptr) return;
  CPF_CHECK(tensor.device() == device_, "DeviceStream::record_use: the tensor is on ", tensor.device(),
            " but the stream belongs to ", device_);
  device_backend(device_.type).record_stream_use(tensor.storage()->data(), device_, handle_);
}

void DeviceStream::synchronize() const { device_backend(device_.type).stream_synchronize(device_, handle_); }

DeviceStreamScope::DeviceStreamScope(const DeviceStream& stream)
    : device_(stream.device()), previous_(device_backend(device_.type).current_stream(device_)) {
  device_backend(device_.type).set_current_stream(device_, stream.handle());
}

DeviceStreamScope::~DeviceStreamScope() { device_backend(device_.type).set_current_stream(device_, previous_); }

}  // namespace cpf
