// The CUDA side of cpf::profile (framework/tensor/profile.h): NVTX ranges and event-pair timers.
//
// NVTX v3 is header-only: with no profiler attached the first push finds no injection library and
// every later call returns at once. Timers record two timing events on the device's current stream
// of the calling thread; a finished timer's events go back to a pool, so steady-state scopes create
// no CUDA events.
#include <nvtx3/nvToolsExt.h>

#include <mutex>
#include <vector>

#include "framework/tensor/cuda/cuda_check.cuh"
#include "framework/tensor/cuda/host_sync.cuh"
#include "framework/tensor/cuda/runtime.cuh"
#include "framework/tensor/profile.h"

namespace cpf::cuda {
namespace {

struct Timer {
  int device = 0;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
};

std::mutex g_pool_mutex;
std::vector<Timer*> g_pool;

void range_push(const char* name) { nvtxRangePushA(name); }
void range_pop() { nvtxRangePop(); }

void* timer_start(Device device) {
  check_device_index(device.index);
  Timer* timer = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_pool_mutex);
    for (size_t i = 0; i < g_pool.size(); ++i) {
      if (g_pool[i]->device == device.index) {
        timer = g_pool[i];
        g_pool.erase(g_pool.begin() + static_cast<std::ptrdiff_t>(i));
        break;
      }
    }
  }
  DeviceGuard guard(device.index);
  if (timer == nullptr) {
    timer = new Timer{.device = device.index};
    CPF_CUDA_CHECK(cudaEventCreate(&timer->start));
    CPF_CUDA_CHECK(cudaEventCreate(&timer->stop));
  }
  timer->stream = current_cuda_stream(device.index);
  CPF_CUDA_CHECK(cudaEventRecord(timer->start, timer->stream));
  return timer;
}

void timer_stop(void* handle) {
  auto* timer = static_cast<Timer*>(handle);
  DeviceGuard guard(timer->device);
  CPF_CUDA_CHECK(cudaEventRecord(timer->stop, timer->stream));
}

double timer_elapsed_ms(void* handle, bool wait) {
  auto* timer = static_cast<Timer*>(handle);
  DeviceGuard guard(timer->device);
  if (wait) {
    count_host_sync(HostSyncKind::stream_sync);  // profiling only (run.profile)
    CPF_CUDA_CHECK(cudaEventSynchronize(timer->stop));
  } else {
    const cudaError_t status = cudaEventQuery(timer->stop);
    if (status == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return -1;
    }
    CPF_CUDA_CHECK(status);
  }
  float ms = 0;
  CPF_CUDA_CHECK(cudaEventElapsedTime(&ms, timer->start, timer->stop));
  return static_cast<double>(ms);
}

void timer_release(void* handle) {
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  g_pool.push_back(static_cast<Timer*>(handle));
}

}  // namespace

// Called from register_backend(): touches no CUDA API.
void register_profile_hooks() {
  profile::register_device_hooks(DeviceType::cuda, profile::DeviceHooks{.range_push = &range_push,
                                                                        .range_pop = &range_pop,
                                                                        .timer_start = &timer_start,
                                                                        .timer_stop = &timer_stop,
                                                                        .timer_elapsed_ms = &timer_elapsed_ms,
                                                                        .timer_release = &timer_release});
}

}  // namespace cpf::cuda
