#pragma once
// CUDA-graph capture for DeviceGraph (framework/tensor/device_graph.h; private to framework/tensor/cuda).
//
// A capture runs the body on a stream of its own in relaxed capture mode (the caching allocator may
// cudaMalloc meanwhile), with a private pool of the allocator (allocator.cuh) so every address the graph
// holds stays its own, and with host->device uploads redirected from the shared pinned ring (whose
// slots are reused) into pinned memory the graph owns, so a replay copies the bytes of the capture.
#include <cuda_runtime.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

namespace cpf::cuda {

// Pinned host copies of the uploads made during one capture; freed with the graph.
class CaptureUploads {
 public:
  CaptureUploads() = default;
  ~CaptureUploads();
  CaptureUploads(const CaptureUploads&) = delete;
  CaptureUploads& operator=(const CaptureUploads&) = delete;

  // Allocates the first chunk (before the capture begins, so no pinned allocation happens inside it
  // unless the uploads outgrow it).
  void reserve();
  // A pinned copy of `nbytes` bytes at `src`, alive as long as this object.
  const void* keep(const void* src, size_t nbytes);

 private:
  std::vector<void*> chunks_;
  size_t chunk_size_ = 0;  // of the newest chunk
  size_t used_ = 0;        // bytes used in the newest chunk
};

// The uploads of the capture running on this thread, or null.
CaptureUploads* active_capture_uploads();

// The backend's entries (backend.cpp): capture `body` on `device`, and replay a captured graph on the
// device's current stream.
std::shared_ptr<void> capture_graph(int device, const std::function<void()>& body);
void replay_graph(int device, void* graph);

}  // namespace cpf::cuda
