#include "apps/trainer/step/step_readback.h"

#include <map>
#include <optional>
#include <utility>

#if CPF_HAVE_CUDA
#include "framework/tensor/cuda/host_readback.h"
#endif

namespace cpf::trainer {

struct StepReadback::Impl {
  Device device;
#if CPF_HAVE_CUDA
  std::optional<cuda::HostReadback> gpu;
#endif
  std::optional<std::vector<double>> read;  // values read at enqueue (the host path)
};

StepReadback& StepReadback::for_device(Device device) {
  // Per thread: rank threads each run their own steps (and streams).
  thread_local std::map<std::pair<int, int>, std::unique_ptr<StepReadback>> readbacks;
  std::unique_ptr<StepReadback>& r = readbacks[{static_cast<int>(device.type), device.index}];
  if (!r) r = std::make_unique<StepReadback>(device);
  return *r;
}

StepReadback::StepReadback(Device device) : impl_(std::make_unique<Impl>()) {
  impl_->device = device;
#if CPF_HAVE_CUDA
  if (device.is_cuda()) impl_->gpu.emplace(device.index);
#endif
}
StepReadback::~StepReadback() = default;

void StepReadback::enqueue(const std::vector<Tensor>& values) {
  // Values never waited for belong to a step that threw after its enqueue: dropped.
  impl_->read.reset();
#if CPF_HAVE_CUDA
  if (impl_->gpu && impl_->gpu->pending()) (void)impl_->gpu->wait();
  bool on_device = impl_->gpu.has_value();
  for (const Tensor& v : values) on_device = on_device && v.defined() && v.device() == impl_->device;
  if (on_device) return impl_->gpu->enqueue(values);
#endif
  std::vector<double> read;
  for (const Tensor& v : values) read.push_back(v.item<double>());
  impl_->read = std::move(read);
}

std::vector<double> StepReadback::wait() {
  if (impl_->read) {
    std::vector<double> out = std::move(*impl_->read);
    impl_->read.reset();
    return out;
  }
#if CPF_HAVE_CUDA
  if (impl_->gpu) return impl_->gpu->wait();  // throws without a pending enqueue
#endif
  CPF_FAIL("StepReadback::wait: nothing was enqueued since the last wait");
}

}  // namespace cpf::trainer
