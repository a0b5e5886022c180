#pragma once
// Small host->device copies through pinned memory (private to framework/tensor/cuda).
//
// A copy from pageable host memory lets the driver wait for the stream before it returns, so every
// small upload inside a training step (the batch's tokens, positions and labels, the multi-tensor
// kernels' pointer tables, attention's sequence tables) could stall the host until the device had
// caught up. The ring copies the source into a pinned buffer and queues the DMA from there: the call
// returns once the source has been read, as before, and the host never waits for the device unless
// the ring runs out of room (more than kUploadRingBytes of uploads still queued), in which case it
// waits for the oldest ones (counted as upload waits, host_sync.cuh).
//
// One ring per device, shared by the threads of a process (a mutex); regions are handed out in ring
// order, each with an event recorded after its DMA, and reused once that event has completed.
#include <cuda_runtime.h>

#include <cstddef>

namespace cpf::cuda {

inline constexpr size_t kUploadRingBytes = size_t(16) << 20;
// Copies at most this large go through the ring; larger ones use the double-buffered staging path.
inline constexpr size_t kUploadRingMaxCopy = kUploadRingBytes / 4;

// Copies nbytes (0 < nbytes <= kUploadRingMaxCopy) from host `src` to device `dst` on `stream`
// (device `device` current). Returns once `src` may be reused.
void ring_upload(int device, void* dst, const void* src, size_t nbytes, cudaStream_t stream);

}  // namespace cpf::cuda
