#pragma once
// The thread backend's operations, as they run on a rank's progress thread. Each takes arguments
// already validated by ProcessGroup's public methods, meets the other ranks in the group's
// rendezvous (which checks what only several ranks can: same operation, dtype, shapes,
// parameters), does this rank's share of the data movement and returns the result tensors.
//
// Shares: all_reduce splits the elements into n ranges and rank r reduces range r of every input
// into range r of every output (each byte is read and written once in all); all_gather,
// reduce_scatter, all_to_all and broadcast pull: each rank fills its own output from the others'
// inputs.
#include <memory>
#include <string>
#include <vector>

#include "framework/distributed/process_group.h"
#include "framework/distributed/thread/group_state.h"

namespace cpf::dist::thread {

struct OpContext {
  GroupState& group;
  int rank = 0;      // in the group
  uint64_t seq = 0;  // the step: how many collectives this rank issued on the group before
  std::string what;  // "all_reduce on group 'world'"
};

std::vector<Tensor> run_all_reduce(const OpContext& ctx, const Tensor& input, ReduceOp op, const Tensor& out);
std::vector<Tensor> run_broadcast(const OpContext& ctx, const Tensor& input, int root, const Tensor& out);
std::vector<Tensor> run_all_gather(const OpContext& ctx, const Tensor& input, int64_t dim, const Tensor& out);
std::vector<Tensor> run_reduce_scatter(const OpContext& ctx, const Tensor& input, int64_t dim, ReduceOp op,
                                       const Tensor& out, int64_t out_size, const std::vector<int64_t>& splits);
std::vector<Tensor> run_all_to_all(const OpContext& ctx, const Tensor& input, int64_t split_dim, int64_t concat_dim,
                                   const Tensor& out);
std::vector<Tensor> run_barrier(const OpContext& ctx);
// The new group's shared state on its members, null elsewhere.
std::shared_ptr<GroupState> run_new_group(const OpContext& ctx, const std::vector<int>& ranks, const std::string& name);
// Every part of `partition` as a group in one rendezvous; this rank's part's state.
std::shared_ptr<GroupState> run_split(const OpContext& ctx, const std::vector<std::vector<int>>& partition,
                                      const std::string& name);

// Point-to-point: not a rendezvous step (no seq). Posts every send, then receives in order, then
// completes the sends. Returns the receive buffers.
std::vector<Tensor> run_batch_p2p(GroupState& group, int rank, const std::vector<P2POp>& ops);

}  // namespace cpf::dist::thread
