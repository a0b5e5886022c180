// HostReadback (host_readback.h): pinned slots, one event, and the dtype conversions of item<double>().
#include "framework/tensor/cuda/host_readback.h"

#include <cstdint>
#include <cstring>

#include "framework/tensor/cuda/cuda_check.cuh"
#include "framework/tensor/cuda/device_errors.cuh"
#include "framework/tensor/cuda/host_sync.cuh"
#include "framework/tensor/cuda/runtime.cuh"

namespace cpf::cuda {

struct HostReadback::State {
  void* pinned = nullptr;  // kMaxValues slots of 8 bytes
  cudaEvent_t done = nullptr;
  std::vector<DType> dtypes;  // of the pending values; empty when nothing is pending
  bool pending = false;

  ~State() {
    // No check: at process exit the driver may already be gone; the memory goes with the process.
    if (done != nullptr) (void)cudaEventDestroy(done);
    if (pinned != nullptr) (void)cudaFreeHost(pinned);
  }
};

HostReadback::HostReadback(int device) : device_(device), state_(std::make_unique<State>()) {}
HostReadback::~HostReadback() = default;

bool HostReadback::pending() const { return state_->pending; }

void HostReadback::enqueue(const std::vector<Tensor>& values) {
  CPF_CHECK(!state_->pending, "HostReadback::enqueue: the previous values were not waited for (call wait() first)");
  CPF_CHECK(!values.empty() && values.size() <= kMaxValues, "HostReadback::enqueue: takes 1 to ", kMaxValues,
            " values, got ", values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    const Tensor& v = values[i];
    CPF_CHECK(v.defined(), "HostReadback::enqueue: value ", i, " is an undefined tensor");
    CPF_CHECK(v.device() == Device::cuda(device_), "HostReadback::enqueue: value ", i, " is on ", v.device(),
              " but this readback is for ", Device::cuda(device_));
    CPF_CHECK(v.numel() == 1, "HostReadback::enqueue: value ", i, " must have one element, got shape ", v.shape());
    CPF_CHECK(is_floating(v.dtype()), "HostReadback::enqueue: value ", i, " has dtype ", v.dtype(),
              "; only f32, f64 and bf16 values are read back");
  }
  check_device_index(device_);
  DeviceGuard guard(device_);
  if (state_->pinned == nullptr) {
    CPF_CUDA_CHECK(cudaHostAlloc(&state_->pinned, kMaxValues * 8, cudaHostAllocPortable));
    CPF_CUDA_CHECK(cudaEventCreateWithFlags(&state_->done, cudaEventDisableTiming));
  }
  cudaStream_t stream = current_cuda_stream(device_);
  state_->dtypes.clear();
  char* slots = static_cast<char*>(state_->pinned);
  for (size_t i = 0; i < values.size(); ++i) {
    CPF_CUDA_CHECK(cudaMemcpyAsync(slots + 8 * i, values[i].raw_data(), dtype_size(values[i].dtype()),
                                   cudaMemcpyDeviceToHost, stream));
    state_->dtypes.push_back(values[i].dtype());
  }
  CPF_CUDA_CHECK(cudaEventRecord(state_->done, stream));
  state_->pending = true;
}

namespace {

// One slot as item<double>() converts it: every floating dtype widens to f64 exactly.
double slot_value(const char* slot, DType dtype) {
  switch (dtype) {
    case DType::f64: {
      double v;
      std::memcpy(&v, slot, sizeof v);
      return v;
    }
    case DType::f32: {
      float v;
      std::memcpy(&v, slot, sizeof v);
      return static_cast<double>(v);
    }
    default: {  // bf16: the upper half of an f32
      uint16_t bits;
      std::memcpy(&bits, slot, sizeof bits);
      const uint32_t wide = static_cast<uint32_t>(bits) << 16;
      float v;
      std::memcpy(&v, &wide, sizeof v);
      return static_cast<double>(v);
    }
  }
}

}  // namespace

std::vector<double> HostReadback::wait() {
  CPF_CHECK(state_->pending, "HostReadback::wait: nothing was enqueued since the last wait");
  DeviceGuard guard(device_);
  count_host_sync(HostSyncKind::stream_sync);
  CPF_CUDA_CHECK(cudaEventSynchronize(state_->done));
  state_->pending = false;  // only now may the next enqueue reuse the pinned slots
  // The host has waited for the stream up to the event: report an index error its earlier kernels found.
  raise_device_errors(device_);
  std::vector<double> out;
  const char* slots = static_cast<const char*>(state_->pinned);
  for (size_t i = 0; i < state_->dtypes.size(); ++i) out.push_back(slot_value(slots + 8 * i, state_->dtypes[i]));
  return out;
}

}  // namespace cpf::cuda
