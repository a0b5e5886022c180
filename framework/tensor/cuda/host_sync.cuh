#pragma once
// The host-synchronisation counter of the CUDA backend (private to framework/tensor/cuda; the public
// reading is cuda::host_sync_counts() in cuda.h). Every point of the backend where the host waits for
// the device, or may (a cudaMalloc/cudaFree), calls count_host_sync with
// its kind, so a test can assert that a training step has none.
#include <cstdint>

namespace cpf::cuda {

enum class HostSyncKind : int {
  device_to_host = 0,  // a device->host copy (item(), to_vector(), to(cpu)) waits for its stream
  upload_waits = 1,    // a host->device copy waited for pinned room (earlier uploads still queued)
  stream_sync = 2,     // cudaStreamSynchronize / cudaEventSynchronize
  device_sync = 3,     // cudaDeviceSynchronize
  device_malloc = 4,   // cudaMalloc / cudaFree (the allocator's slow path): implicitly synchronising
};

// Adds one to the process-wide count of `kind` (relaxed atomic: cheap enough to stay on).
void count_host_sync(HostSyncKind kind);

}  // namespace cpf::cuda
