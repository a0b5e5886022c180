#include "framework/distributed/nccl/nccl_work.cuh"

#include "framework/core/error.h"
#include "framework/tensor/cuda/runtime.cuh"

namespace cpf::dist::nccl {

NcclWork::NcclWork(std::shared_ptr<NcclRankState> state, std::shared_ptr<Communicator> comm,
                   std::shared_ptr<CompletionEvent> done, cudaStream_t comm_stream, bool record_now,
                   cudaStream_t issue_stream, std::vector<Tensor> results, std::vector<Tensor> keep_alive,
                   bool host_blocking)
    : state_(std::move(state)),
      comm_(std::move(comm)),
      done_(std::move(done)),
      issue_stream_(issue_stream),
      results_(std::move(results)),
      keep_alive_(std::move(keep_alive)),
      host_blocking_(host_blocking) {
  if (record_now) done_->record(comm_stream);
}

NcclWork::~NcclWork() {
  if (!waited_.load()) {
    // The tensors kept alive here go back to the allocator now: order their reuse after the
    // operation on the stream they were allocated on, which needs its event recorded. A launch that
    // cannot be finished aborted the world (the aborted communicator's kernels return): nothing to order.
    QuietDeviceGuard guard(state_->device());
    if (!done_->recorded()) {
      try {
        state_->finish_launch(*comm_);
      } catch (...) {
      }
    }
    if (done_->recorded()) (void)cudaStreamWaitEvent(issue_stream_, done_->get(), 0);
  }
}

void NcclWork::wait() {
  state_->check_alive(description());
  cuda::DeviceGuard guard(state_->device());
  if (!done_->recorded()) state_->finish_launch(*comm_);
  state_->check_alive(description());  // an abort dropped the pending launch
  CPF_CHECK(done_->recorded(), description(), ": its completion event was never recorded (a deferred launch lost)");
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
  // Not recorded yet: the launch is pending; a pooled event still holds an older record.
  if (!done_->recorded() && !state_->try_finish_launch(*comm_)) return state_->aborted();
  if (!done_->recorded()) return state_->aborted();
  return cudaEventQuery(done_->get()) == cudaSuccess;
}

const std::vector<Tensor>& NcclWork::result() const {
  CPF_CHECK(waited_.load() || is_completed(), description(),
            ": result() before the operation completed; call wait() first");
  state_->check_alive(description());
  return results_;
}

}  // namespace cpf::dist::nccl
