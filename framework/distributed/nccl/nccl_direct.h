#pragma once
// Direct NCCL calls on a group's communicator, bypassing NcclProcessGroup's own work (validation,
// communication stream, events, staging): the baseline that benchmarks compare the group against
// (benchmarks/gpu/nccl_bench.cpp). No CUDA or NCCL header is included.
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

}  // namespace cpf::dist::nccl
