#include "framework/tensor/device_graph.h"

#include "framework/core/error.h"
#include "framework/tensor/storage.h"

namespace cpf {

bool DeviceGraph::supported(Device device) {
  return device.is_cuda() && has_device_backend(device.type) && device_backend(device.type).graphs_supported();
}

DeviceGraph DeviceGraph::capture(Device device, const std::function<void()>& body) {
  CPF_CHECK(body != nullptr, "DeviceGraph::capture: no body to capture");
  CPF_CHECK(supported(device), "DeviceGraph::capture: ", device,
            " cannot capture graphs (CUDA devices only, in a build with the CUDA backend)");
  std::shared_ptr<void> impl = device_backend(device.type).capture_graph(device, body);
  CPF_CHECK(impl != nullptr, "DeviceGraph::capture: the backend of ", device, " returned no graph");
  return DeviceGraph(device, std::move(impl));
}

void DeviceGraph::replay() const {
  CPF_CHECK(impl_ != nullptr, "DeviceGraph::replay: no graph was captured");
  device_backend(device_.type).replay_graph(device_, impl_.get());
}

}  // namespace cpf
