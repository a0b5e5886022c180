#pragma once
// NcclProcessGroup: the ProcessGroup of one rank over one NCCL communicator, on one GPU.
//
// Streams: each group has its own communication stream (non-blocking). An operation first makes
// its inputs contiguous and allocates its outputs on the caller's current stream, records an event
// there that the communication stream waits for, then runs the NCCL calls (and any staging copies)
// on the communication stream and records the Work's completion event; Work::wait() makes the
// caller's current stream wait for it. So communication overlaps with compute issued after it, and
// different groups (dp, cp) communicate concurrently. Outputs handed back are allocated on the
// caller's stream; staging buffers on the communication stream.
//
// Shapes that differ between ranks are not detected by NCCL: ranks must agree as the ProcessGroup
// contract says (mismatches end in the timeout, which aborts the world with a message).
#include <cuda_runtime.h>
#include <nccl.h>

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "framework/distributed/nccl/function_ref.h"
#include "framework/distributed/nccl/nccl_rank_state.cuh"
#include "framework/distributed/nccl/nccl_ready.cuh"
#include "framework/distributed/process_group.h"
#include "framework/tensor/cuda/cuda.h"

namespace cpf::dist::nccl {

class NcclProcessGroup final : public ProcessGroup {
 public:
  // Takes ownership of `comm` (an initialised communicator of `global_ranks.size()` ranks on
  // state->device()). `id` names the group alike on every rank ("world", "world/2": the world's
  // second new_group) for the arrival board of group creation (AbortDomain::meet_at_new_group).
  NcclProcessGroup(std::shared_ptr<NcclRankState> state, ncclComm_t comm, int rank, std::vector<int> global_ranks,
                   std::string name, std::string id);
  ~NcclProcessGroup() override;

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(global_ranks_.size()); }
  const std::string& name() const override { return name_; }
  const std::vector<int>& global_ranks() const override { return global_ranks_; }
  std::string backend() const override { return "nccl"; }
  std::chrono::milliseconds timeout() const override { return state_->timeout(); }
  void abort(const std::string& reason) override { state_->abort(reason); }

  Device device() const { return Device::cuda(state_->device()); }
  // The communicator, for NCCL calls made through run_nccl.
  ncclComm_t comm() const { return comm_->comm; }
  cudaStream_t comm_stream() const { return static_cast<cudaStream_t>(stream_.handle()); }
  // NCCL calls on this group's communicator (NcclRankState::run): under the rank's lock, then
  // bounded until the communicator is ready again; every NCCL call on it goes through here.
  void run_nccl(std::string_view call, FunctionRef<ncclResult_t()> calls, const std::string& context,
                const StallCause& stall_cause = NcclRankState::kPeerStallCause) {
    state_->run(*comm_, call, calls, context, stall_cause);
  }
  // Keeps `object` alive as long as this group (the world group holds its rendezvous).
  void attach(std::shared_ptr<void> object) { attached_.push_back(std::move(object)); }

  // What an operation's body gets: the communicator, the stream to enqueue on, the message prefix,
  // the completion event, and whether the body deferred its launch (run_nccl_last sets it).
  struct Issue {
    ncclComm_t comm;
    cudaStream_t stream;
    const std::string& context;
    const std::shared_ptr<CompletionEvent>& done;
    bool& deferred;
  };
  // A body's NCCL calls: with `last` (the body queues nothing on is.stream after them) through
  // NcclRankState::run_deferred, which does not wait for NCCL's launch thread and records is.done
  // itself; else through run_nccl (bounded wait until the communicator is ready again). `call`: a literal.
  void run_body_nccl(const Issue& is, bool last, const char* call, FunctionRef<ncclResult_t()> calls);

 protected:
  WorkPtr do_all_reduce(const Tensor& input, ReduceOp op, const Tensor& out) override;
  WorkPtr do_broadcast(const Tensor& input, int root, const Tensor& out) override;
  WorkPtr do_all_gather(const Tensor& input, int64_t dim, const Tensor& out) override;
  WorkPtr do_reduce_scatter(const Tensor& input, int64_t dim, ReduceOp op, const Tensor& out, int64_t out_size,
                            const std::vector<int64_t>& splits) override;
  WorkPtr do_all_to_all(const Tensor& input, int64_t split_dim, int64_t concat_dim, const Tensor& out) override;
  WorkPtr do_batch_p2p(const std::vector<P2POp>& ops) override;
  WorkPtr do_barrier() override;
  std::shared_ptr<ProcessGroup> do_new_group(const std::vector<int>& ranks, const std::string& name) override;

 private:
  // Runs one operation named `context` (op_context: built once per operation): `prepare` on the
  // caller's stream (contiguous inputs, outputs; returns the tensors to keep alive), then `body` on
  // the communication stream (NCCL calls, staging copies). `results` are what Work::result() returns.
  WorkPtr issue(const std::string& context, const std::vector<Tensor>& results, std::vector<Tensor> keep_alive,
                FunctionRef<void(const Issue&, std::vector<Tensor>& staging)> body, bool host_blocking = false);
  void check_device(const Tensor& t, const std::string& context, const char* what) const;
  // Every rank's size of something (e.g. its piece along a dim): a small all_gather the host waits for.
  std::vector<int64_t> exchange_sizes(int64_t mine, const std::string& context);
  // The first step of new_group (nccl_new_group.cpp) when every rank of this group runs in this
  // process: they meet at their `count`-th new_group on the domain's arrival board and show they
  // ask for the same group; throws naming the ranks that never came (by the timeout) or that asked
  // for another group.
  void meet_for_new_group(const std::vector<int>& ranks, const std::string& name, int count,
                          const std::string& new_name, const std::string& context);
  std::string split_stall_cause() const;
  // "rank 1 (global 3)", "ranks [0,1] (global [2,3])": members of this group given by global rank.
  std::string describe_members(const std::vector<int>& globals) const;

  std::shared_ptr<NcclRankState> state_;
  std::shared_ptr<Communicator> comm_;
  const int rank_;
  const std::vector<int> global_ranks_;
  const std::string name_;
  const std::string id_;
  int new_groups_ = 0;  // new_group calls on this group so far
  cuda::Stream stream_;
  std::vector<std::shared_ptr<void>> attached_;
};

// A contiguous tensor of `shape` on `device`, allocated on the current stream.
Tensor empty_on(const Shape& shape, DType dtype, Device device);

}  // namespace cpf::dist::nccl

namespace cpf::dist::nccl {

// This rank's world group over a fresh communicator (collective: every rank of `id` calls it);
// `domain` joins ranks of one process that fail together (null: a domain of its own). Creation is
// non-blocking and bounded (create_communicator: `timeout` while `watch` names a missing rank, else
// at least kCreationFloor); it stops at once when `domain` is aborted (another rank failed, a peer
// process died). Errors name "NCCL world creation (rank r of n on cuda:d)".
ProcessGroupPtr create_world_group(int rank, int world_size, const ncclUniqueId& id, int device,
                                   std::chrono::milliseconds timeout, std::shared_ptr<AbortDomain> domain,
                                   const CreationWatch& watch);
void register_launch_backend();

}  // namespace cpf::dist::nccl
