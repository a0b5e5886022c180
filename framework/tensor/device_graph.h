#pragma once
// DeviceGraph: device work captured once and replayed with one launch (CUDA graphs on cuda devices).
//
//   DeviceGraph graph = DeviceGraph::capture(device, [&] { /* enqueue the work */ });  // nothing runs yet
//   graph.replay();  // runs the captured work on the current stream, after what is queued there
//
// What a capture holds, and the rules its callers keep (docs/training.md, "CUDA graphs"):
// - the kernels, copies and memsets the body enqueued, with their arguments as they were: a host value
//   passed by value (a learning rate, a count, a random seed) is frozen, so it must be the same at every
//   replay;
// - the addresses they touched. Memory the body allocates comes from a pool private to the graph and
//   stays the graph's while it lives: a tensor made by the body and freed later does not hand its
//   memory to anyone else, and tensors the body returns are rewritten by every replay. Memory allocated
//   before the capture (parameters, the inputs the caller refills) must outlive the graph in place;
// - host->device uploads with the bytes they had at capture, kept in pinned memory the graph owns (so
//   the uploaded tables must be the same for every replay).
// The body must not wait for the device (a read-back, a synchronisation) nor use another stream: the
// capture then fails, capture() discards it and throws with the reason, and nothing the body enqueued
// has run (whatever the body computed on the host, e.g. caches it filled, holds unset device memory).
#include <functional>
#include <memory>

#include "framework/tensor/device.h"

namespace cpf {

class DeviceGraph {
 public:
  DeviceGraph() = default;  // no graph: replay() throws

  // Whether `device` can capture graphs (a cuda device in a build with the CUDA backend).
  static bool supported(Device device);
  // Captures the work `body` enqueues on `device` (the body runs once, on this thread, with a capture
  // stream current). Throws when the device cannot capture or the capture fails, naming the reason.
  static DeviceGraph capture(Device device, const std::function<void()>& body);

  // Enqueues the captured work once on the current stream of the device.
  void replay() const;
  bool defined() const { return impl_ != nullptr; }
  Device device() const { return device_; }

 private:
  DeviceGraph(Device device, std::shared_ptr<void> impl) : device_(device), impl_(std::move(impl)) {}
  Device device_ = Device::cpu();
  std::shared_ptr<void> impl_;  // the backend's graph; destroyed (after the device is idle) with the last copy
};

}  // namespace cpf
