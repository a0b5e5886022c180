#pragma once
// Direct NCCL calls on a group's communicator, bypassing NcclProcessGroup's own work (validation,
// communication stream, events, staging): the baselines that benchmarks compare the group against
// (benchmarks/gpu/nccl_bench.cpp, benchmarks/gpu/nccl_post_bench.cpp). No CUDA or NCCL header is included.
#include <memory>
#include <vector>

#include "framework/distributed/process_group.h"

namespace cpf::dist::nccl {

enum class DirectOp {
  all_reduce_sum,  // ncclAllReduce(send, recv, send.numel())
  all_gather,      // ncclAllGather(send, recv, send.numel()); recv holds size() * send.numel()
  all_to_all,      // grouped ncclSend/ncclRecv of send.numel() / size() elements per peer
};

// Enqueues `op` on the caller's current stream of the group's device. `group` must be an NCCL
// group; send and recv contiguous, on its device, with the sizes above.
void issue_direct(ProcessGroup& group, DirectOp op, const Tensor& send, const Tensor& recv);

// The sends and receives of `ops` as one grouped ncclSend/ncclRecv on the caller's current stream,
// through the group's communicator (non-blocking, so followed by the same wait until NCCL has
// launched them as the group's own batch_p2p): batch_p2p_async without its stream hand-off, events,
// Work and watchdog entry. Tensors contiguous, on the group's device; tags are ignored (issue order).
void issue_direct_p2p(ProcessGroup& group, const std::vector<P2POp>& ops);

// A second communicator over the ranks of an NCCL group, created BLOCKING (ncclConfig_t::blocking = 1):
// NCCL launches each call on the calling thread and returns when it is enqueued, where the group's
// non-blocking communicator hands every ncclGroupEnd to a thread of NCCL's and returns ncclInProgress
// (nccl_ready.cuh). It exists to measure what that hand-off costs (nccl_post_bench). It is not
// watched: no timeout, no abort, so a peer that never comes blocks the caller for good; for
// benchmarks and tests only, never for training.
class BlockingCommunicator {
 public:
  // Collective over `group` (every rank calls it): rank 0 makes an ncclUniqueId, `group` broadcasts it.
  explicit BlockingCommunicator(ProcessGroup& group);
  // ncclCommDestroy. With several ranks of the communicator in one process the last rank's destroy
  // waits for every rank's GPU to go idle: destroy it only where this rank issues nothing more on any
  // communicator (e.g. at the end of the rank's function), or a rank waiting in a later collective
  // for the destroying one deadlocks (the reason NcclRankState keeps its communicators to the end).
  ~BlockingCommunicator();
  BlockingCommunicator(const BlockingCommunicator&) = delete;
  BlockingCommunicator& operator=(const BlockingCommunicator&) = delete;

  // As issue_direct_p2p, on this communicator: the calls are enqueued when it returns.
  void batch_p2p(const std::vector<P2POp>& ops);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cpf::dist::nccl
