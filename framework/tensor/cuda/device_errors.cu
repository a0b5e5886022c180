// Device-side index checks, the per-device error record and the CPF_CUDA_SYNC debug mode (see
// device_errors.cuh for the design).
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "framework/core/error.h"
#include "framework/tensor/cuda/cuda.h"
#include "framework/tensor/cuda/device_errors.cuh"
#include "framework/tensor/cuda/kernels.cuh"
#include "framework/tensor/cuda/runtime.cuh"

namespace cpf::cuda {
namespace {

constexpr unsigned long long kNoPosition = ~0ull;

// The error record of a device, in mapped pinned host memory: written by one device thread (the one
// that won `claimed`), `flag` last after a system-wide fence; read by the host after a synchronisation.
struct ErrorRecord {
  int32_t flag;
  int32_t kind;
  uint64_t op;  // the const char* of the op name (a string literal of this process)
  int64_t value, position, bound, dim, ignore;
  int32_t has_ignore, ndim;
  int64_t shape[kIndexCheckMaxDims];
};

struct DeviceErrorState {
  std::mutex mutex;
  ErrorRecord* record = nullptr;  // host pointer (also valid on the device: unified addressing)
  int* claimed = nullptr;         // device memory: 0 until a check claims the record
};

DeviceErrorState& state_for(int device) {
  static std::array<DeviceErrorState, kMaxDevices> states;
  return states[static_cast<size_t>(device)];
}

template <class I>
__global__ void __launch_bounds__(kernels::kThreads)
    find_bad_index_kernel(const I* index, int64_t numel, int64_t bound, int64_t ignore, int has_ignore,
                          unsigned long long* slot) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < numel; i += stride) {
    const int64_t v = static_cast<int64_t>(index[i]);
    if (has_ignore && v == ignore) continue;
    if (v < 0 || v >= bound) atomicMin(slot, static_cast<unsigned long long>(i));
  }
}

template <class I>
__global__ void record_bad_index_kernel(const I* index, const unsigned long long* slot, IndexCheck check, int* claimed,
                                        ErrorRecord* record) {
  const unsigned long long pos = *slot;
  if (pos == kNoPosition) return;
  if (atomicCAS(claimed, 0, 1) != 0) return;  // an earlier error is waiting to be reported
  record->kind = static_cast<int32_t>(check.kind);
  record->op = reinterpret_cast<uint64_t>(check.op);
  record->value = static_cast<int64_t>(index[pos]);
  record->position = static_cast<int64_t>(pos);
  record->bound = check.bound;
  record->dim = check.dim;
  record->ignore = check.ignore;
  record->has_ignore = check.has_ignore;
  record->ndim = check.ndim;
  for (int d = 0; d < check.ndim; ++d) record->shape[d] = check.shape[d];
  __threadfence_system();  // the fields reach host memory before the flag
  *reinterpret_cast<volatile int32_t*>(&record->flag) = 1;
}

// Allocates the record and the claim word of `device` on first use (the caller holds state.mutex).
void init_locked(DeviceErrorState& state, int device) {
  if (state.record != nullptr) return;
  DeviceGuard guard(device);
  void* host = nullptr;
  CPF_CUDA_CHECK(cudaHostAlloc(&host, sizeof(ErrorRecord), cudaHostAllocMapped | cudaHostAllocPortable));
  std::memset(host, 0, sizeof(ErrorRecord));
  void* claimed = nullptr;
  CPF_CUDA_CHECK(cudaMalloc(&claimed, sizeof(int)));
  CPF_CUDA_CHECK(cudaMemset(claimed, 0, sizeof(int)));
  CPF_CUDA_CHECK(cudaStreamSynchronize(nullptr));  // the memset is queued on the legacy stream: finish it
  state.claimed = static_cast<int*>(claimed);
  state.record = static_cast<ErrorRecord*>(host);  // never freed: checks may be in flight at exit
}

std::vector<int64_t> unravel(int64_t flat, const int64_t* shape, int ndim) {
  std::vector<int64_t> index(static_cast<size_t>(ndim));
  for (int d = ndim - 1; d >= 0; --d) {
    index[static_cast<size_t>(d)] = shape[d] > 0 ? flat % shape[d] : 0;
    flat = shape[d] > 0 ? flat / shape[d] : 0;
  }
  return index;
}

// The CPU's message for the recorded error (framework/tensor/ops/index.cpp, embedding.cpp,
// cross_entropy.cpp).
std::string message_of(const ErrorRecord& r) {
  const char* op = reinterpret_cast<const char*>(r.op);
  const std::vector<int64_t> shape(r.shape, r.shape + r.ndim);
  const std::vector<int64_t> pos = unravel(r.position, r.shape, r.ndim);
  using ::cpf::str_cat;
  switch (static_cast<IndexErrorKind>(r.kind)) {
    case IndexErrorKind::embedding_id:
      return str_cat(op, ": id ", r.value, " at position ", pos, " of ids ", shape,
                     " is out of range for a table of V=", r.bound, " rows (expected 0..", r.bound - 1, ")");
    case IndexErrorKind::target:
      return str_cat(op, ": target ", r.value, " at row ", r.position, " is out of range for C=", r.bound,
                     " classes (expected 0..", r.bound - 1, " or ignore_index=", r.ignore, ")");
    default:
      return str_cat(op, ": index ", r.value, " at position ", pos, " is out of range for dim ", r.dim, " of size ",
                     r.bound, " (expected 0 <= index < ", r.bound, ")");
  }
}

std::atomic<int> g_sync_debug{-1};  // -1: not read from the environment yet

}  // namespace

void launch_index_check(const IndexCheck& check, void* slot, int device, int sm_count, cudaStream_t stream) {
  if (check.numel == 0) return;
  CPF_CHECK(check.ndim <= kIndexCheckMaxDims, check.op, ": index tensors of more than ", kIndexCheckMaxDims,
            " dims are not supported on cuda, got ", check.ndim);
  DeviceErrorState& state = state_for(device);
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    init_locked(state, device);
  }
  auto* pos = static_cast<unsigned long long*>(slot);
  CPF_CUDA_CHECK(cudaMemsetAsync(pos, 0xff, sizeof(unsigned long long), stream));
  const int64_t blocks = (check.numel + kernels::kThreads - 1) / kernels::kThreads;
  const auto grid = static_cast<unsigned>(blocks < 8 * int64_t(sm_count) ? blocks : 8 * int64_t(sm_count));
  const auto go = [&]<class I>() {
    const I* index = static_cast<const I*>(check.index);
    find_bad_index_kernel<I>
        <<<grid, kernels::kThreads, 0, stream>>>(index, check.numel, check.bound, check.ignore, check.has_ignore, pos);
    CPF_CUDA_CHECK_LAUNCH("index check kernel");
    record_bad_index_kernel<I><<<1, 1, 0, stream>>>(index, pos, check, state.claimed, state.record);
    CPF_CUDA_CHECK_LAUNCH("index check kernel (record)");
  };
  if (check.index_dtype == kernels::kI32) {
    go.template operator()<int32_t>();
  } else {
    go.template operator()<int64_t>();
  }
}

void raise_device_errors(int device) {
  if (device < 0 || device >= kMaxDevices) return;
  DeviceErrorState& state = state_for(device);
  std::unique_lock<std::mutex> lock(state.mutex);
  if (state.record == nullptr) return;
  volatile ErrorRecord* r = state.record;
  if (r->flag == 0) return;
  ErrorRecord copy;
  std::memcpy(&copy, const_cast<ErrorRecord*>(state.record), sizeof(ErrorRecord));
  std::memset(const_cast<ErrorRecord*>(state.record), 0, sizeof(ErrorRecord));
  {
    // The record is free again: later checks may report their own errors.
    // cudaMemset is queued on the legacy stream: wait for it, so a check on a non-blocking stream that
    // runs next cannot still see the old claim and drop its error.
    DeviceGuard guard(device);
    CPF_CUDA_CHECK(cudaMemset(state.claimed, 0, sizeof(int)));
    CPF_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  }
  lock.unlock();
  ::cpf::detail::throw_error(__FILE__, __LINE__, "index check on the device", message_of(copy));
}

void check_device_errors(int device) {
  check_device_index(device);
  raise_device_errors(device);
}

bool sync_debug_enabled() {
  int v = g_sync_debug.load(std::memory_order_relaxed);
  if (v < 0) {
    const char* env = std::getenv("CPF_CUDA_SYNC");
    v = env != nullptr && env[0] != '\0' && std::strcmp(env, "0") != 0 ? 1 : 0;
    int expected = -1;
    if (!g_sync_debug.compare_exchange_strong(expected, v)) v = expected;  // set_sync_debug() came first
  }
  return v == 1;
}

void set_sync_debug(bool enabled) { g_sync_debug.store(enabled ? 1 : 0, std::memory_order_relaxed); }
bool sync_debug() { return sync_debug_enabled(); }

void sync_after_launch(const char* what) {
  int device = 0;
  CPF_CUDA_CHECK(cudaGetDevice(&device));
  const cudaError_t status = cudaDeviceSynchronize();
  if (status != cudaSuccess) {
    ::cpf::cuda::detail::throw_cuda_error(
        __FILE__, __LINE__, ::cpf::str_cat(what, " (CPF_CUDA_SYNC=1: failed while it ran)").c_str(), status);
  }
  raise_device_errors(device);
}

}  // namespace cpf::cuda
