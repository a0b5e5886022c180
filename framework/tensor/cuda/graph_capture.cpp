// CUDA-graph capture and replay (graph_capture.cuh, framework/tensor/device_graph.h).
#include "framework/tensor/cuda/graph_capture.cuh"

#include <algorithm>
#include <cstring>
#include <mutex>

#include "framework/core/error.h"
#include "framework/tensor/cuda/allocator.cuh"
#include "framework/tensor/cuda/cuda_check.cuh"
#include "framework/tensor/cuda/runtime.cuh"

namespace cpf::cuda {
namespace {

constexpr size_t kUploadChunkBytes = size_t(1) << 20;

thread_local CaptureUploads* t_uploads = nullptr;

// Sets this thread's capture uploads for a scope.
class UploadsScope {
 public:
  explicit UploadsScope(CaptureUploads* uploads) : previous_(t_uploads) { t_uploads = uploads; }
  ~UploadsScope() { t_uploads = previous_; }
  UploadsScope(const UploadsScope&) = delete;
  UploadsScope& operator=(const UploadsScope&) = delete;

 private:
  CaptureUploads* previous_;
};

// A captured graph and everything its replays need: the stream it was captured on (kept so that its
// handle, part of the stream-keyed table caches' keys, is not given to another stream while those
// entries live), the allocator pool holding its addresses and the pinned copies of its uploads.
struct CapturedGraph {
  int device = 0;
  Stream stream;
  int pool = 0;
  CaptureUploads uploads;
  cudaGraphExec_t exec = nullptr;

  CapturedGraph(int d, Stream s) : device(d), stream(std::move(s)) {}
  ~CapturedGraph() {
    try {
      DeviceGuard guard(device);
      // Replays may still run on any stream: the pool and the pinned uploads are freed after them.
      (void)cudaDeviceSynchronize();
      if (exec != nullptr) (void)cudaGraphExecDestroy(exec);
    } catch (...) {
      // A destructor never throws: a context broken by a fault in a replay, or torn down at exit.
    }
    (void)cudaGetLastError();
    allocator_for(device).release_pool(pool);
  }
};

// Streams of failed captures, never destroyed: the table caches may hold entries keyed by their handles
// whose device memory was never written (the capture ran nothing), and a new stream must not inherit one.
void keep_stream_forever(Stream stream) {
  static std::mutex mutex;
  static auto* streams = new std::vector<Stream>();  // intentionally never freed
  std::lock_guard<std::mutex> lock(mutex);
  streams->push_back(std::move(stream));
}

// Ends the capture on `stream` into an instantiated graph; throws when the capture was invalidated.
cudaGraphExec_t end_capture(cudaStream_t stream) {
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  if (ended != cudaSuccess) {
    (void)cudaGetLastError();
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    CPF_FAIL("the capture was invalidated (", cudaGetErrorString(ended),
             "): the captured work waited for the device or joined a stream it did not fork");
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
  (void)cudaGraphDestroy(graph);
  CPF_CUDA_CHECK(made);
  return exec;
}

void abandon_capture(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) == cudaSuccess && status != cudaStreamCaptureStatusNone) {
    cudaGraph_t graph = nullptr;
    (void)cudaStreamEndCapture(stream, &graph);
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
  }
  (void)cudaGetLastError();
}

}  // namespace

CaptureUploads::~CaptureUploads() {
  for (void* chunk : chunks_) (void)cudaFreeHost(chunk);
  (void)cudaGetLastError();
}

void CaptureUploads::reserve() {
  if (!chunks_.empty()) return;
  void* chunk = nullptr;
  CPF_CUDA_CHECK(cudaHostAlloc(&chunk, kUploadChunkBytes, cudaHostAllocDefault));
  chunks_.push_back(chunk);
  chunk_size_ = kUploadChunkBytes;
  used_ = 0;
}

const void* CaptureUploads::keep(const void* src, size_t nbytes) {
  if (chunks_.empty() || used_ + nbytes > chunk_size_) {
    const size_t size = std::max(kUploadChunkBytes, nbytes);
    void* chunk = nullptr;
    CPF_CUDA_CHECK(cudaHostAlloc(&chunk, size, cudaHostAllocDefault));
    chunks_.push_back(chunk);
    chunk_size_ = size;
    used_ = 0;
  }
  char* dst = static_cast<char*>(chunks_.back()) + used_;
  std::memcpy(dst, src, nbytes);
  used_ += (nbytes + 15) / 16 * 16;  // 16-byte aligned copies
  return dst;
}

CaptureUploads* active_capture_uploads() { return t_uploads; }

std::shared_ptr<void> capture_graph(int device, const std::function<void()>& body) {
  DeviceGuard guard(device);
  auto graph = std::make_shared<CapturedGraph>(device, Stream::create(device));
  const auto stream = static_cast<cudaStream_t>(graph->stream.handle());
  graph->uploads.reserve();
  CachingAllocator& allocator = allocator_for(device);
  // What the eager steps cached goes back first, so the pool's blocks do not double the memory held.
  allocator.empty_cache();
  graph->pool = allocator.begin_pool(stream);
  try {
    const StreamGuard on_capture(graph->stream);
    const UploadsScope uploads(&graph->uploads);
    // Relaxed: the allocator's cudaMalloc (not a stream operation) stays legal during the capture.
    CPF_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
    body();
    graph->exec = end_capture(stream);
  } catch (...) {
    // Whatever the body threw: a pool left capturing would take every later allocation on the stream and
    // keep the allocator in capture mode (no cache release on out-of-memory).
    abandon_capture(stream);
    allocator.end_pool_capture(graph->pool);
    keep_stream_forever(graph->stream);
    try {
      throw;
    } catch (const std::exception& e) {
      CPF_FAIL("CUDA-graph capture on cuda:", device, " failed: ", e.what());
    }
  }
  allocator.end_pool_capture(graph->pool);
  CapturedGraph* raw = graph.get();
  return std::shared_ptr<void>(std::move(graph), raw);
}

void replay_graph(int device, void* graph) {
  auto* g = static_cast<CapturedGraph*>(graph);
  CPF_CHECK(g != nullptr && g->device == device, "replay_graph: the graph belongs to cuda:", g ? g->device : -1,
            ", not cuda:", device);
  DeviceGuard guard(device);
  CPF_CUDA_CHECK(cudaGraphLaunch(g->exec, current_cuda_stream(device)));
}

}  // namespace cpf::cuda
