#pragma once
// NcclWork: the Work of an operation issued on a group's communication stream.
//
// Completion is a CUDA event recorded on the communication stream after the operation. wait()
// makes the caller's current stream wait for that event (no host block), as torch.distributed
// does; operations marked host_blocking (barrier) also block the host until the event completed,
// bounded by the group's timeout. Until wait() the Work keeps the operation's tensors alive (inputs,
// outputs and staging buffers), so the caching allocator cannot hand their memory to other work
// while the communication stream still uses it; a Work dropped without wait() makes the stream it
// was issued from wait for the event instead, for the same reason.
//
// A deferred launch (NcclRankState::run_deferred) records the event only once NCCL's thread has
// launched the operation: wait(), is_completed(), result() and the destructor finish that launch
// first (wait and the destructor poll, bounded; is_completed polls once), so callers see no difference.
#include <cuda_runtime.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "framework/distributed/nccl/nccl_rank_state.cuh"
#include "framework/distributed/work.h"

namespace cpf::dist::nccl {

class NcclWork final : public Work {
 public:
  // `issue_stream` is the caller's stream. With `record_now`, records the completion event on
  // `comm_stream` now; else the operation's launch was deferred on `comm` (run_deferred), which
  // records it. The Work is described by done->description().
  NcclWork(std::shared_ptr<NcclRankState> state, std::shared_ptr<Communicator> comm,
           std::shared_ptr<CompletionEvent> done, cudaStream_t comm_stream, bool record_now, cudaStream_t issue_stream,
           std::vector<Tensor> results, std::vector<Tensor> keep_alive, bool host_blocking);
  ~NcclWork() override;
  NcclWork(const NcclWork&) = delete;
  NcclWork& operator=(const NcclWork&) = delete;

  void wait() override;
  bool is_completed() const override;
  const std::vector<Tensor>& result() const override;
  const std::string& description() const override { return done_->description(); }

  const std::shared_ptr<CompletionEvent>& completion() const { return done_; }

 private:
  const std::shared_ptr<NcclRankState> state_;
  const std::shared_ptr<Communicator> comm_;
  const std::shared_ptr<CompletionEvent> done_;
  cudaStream_t issue_stream_ = nullptr;
  std::vector<Tensor> results_;
  std::vector<Tensor> keep_alive_;
  const bool host_blocking_;
  std::atomic<bool> waited_{false};
};

}  // namespace cpf::dist::nccl
