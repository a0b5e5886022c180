#include "framework/distributed/nccl/nccl_work.cuh"

#include "framework/core/error.h"
#include "framework/tensor/cuda/runtime.cuh"

namespace cpf::dist::nccl {

NcclWork::NcclWork(std::shared_ptr<NcclRankState> state, std::shared_ptr<CompletionEvent> done,
                   cudaStream_t comm_stream, cudaStream_t issue_stream, std::vector<Tensor> results,
                   std::vector<Tensor> keep_alive, bool host_blocking)
    : state_(std::move(state)),
      done_(std::move(done)),
      issue_stream_(issue_stream),
      results_(std::move(results)),
      keep_alive_(std::move(keep_alive)),
      host_blocking_(host_blocking) {
  done_->record(comm_stream);
}

NcclWork::~NcclWork() {
  if (!waited_.load()) {
    // The tensors kept alive here go back to the allocator now: order their reuse after the
    // operation on the stream they were allocated on.
    QuietDeviceGuard guard(state_->device());
    (void)cudaStreamWaitEvent(issue_stream_, done_->get(), 0);
  }
}

void NcclWork::wait() {
  state_->check_alive(description());
  cuda::DeviceGuard guard(state_->device());
  const cudaStream_t current = cuda::current_cuda_stream(state_->device());
  CPF_CUDA_CHECK(cudaStreamWaitEvent(current, done_->get(), 0));
  // The kept tensors go back to the pool of the stream that issued the operation: when another stream
  // waits (the CP ring waits on its side stream), order the issuing one after the operation too, or
  // its next allocation could take a buffer the operation still reads.
  if (current != issue_stream_) CPF_CUDA_CHECK(cudaStreamWaitEvent(issue_stream_, done_->get(), 0));
  if (host_blocking_) state_->host_wait(done_->get(), description());
  state_->check_alive(description());
  waited_.store(true);
  keep_alive_.clear();  // the issuing stream (and the caller's) is now ordered after the operation
}

bool NcclWork::is_completed() const {
  if (state_->aborted()) return true;
  return cudaEventQuery(done_->get()) == cudaSuccess;
}

const std::vector<Tensor>& NcclWork::result() const {
  CPF_CHECK(waited_.load() || is_completed(), description(),
            ": result() before the operation completed; call wait() first");
  state_->check_alive(description());
  return results_;
}

}  // namespace cpf::dist::nccl
