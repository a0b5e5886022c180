#include "framework/distributed/nccl/nccl_direct.h"

#include "framework/core/error.h"
#include "framework/distributed/nccl/nccl_check.cuh"
#include "framework/distributed/nccl/nccl_process_group.cuh"
#include "framework/distributed/nccl/nccl_ready.cuh"
#include "framework/tensor/cuda/runtime.cuh"

namespace cpf::dist::nccl {

void issue_direct(ProcessGroup& group, DirectOp op, const Tensor& send, const Tensor& recv) {
  auto* nccl_group = dynamic_cast<NcclProcessGroup*>(&group);
  CPF_CHECK(nccl_group != nullptr, "issue_direct: ", group.describe(), " is a ", group.backend(),
            " group, not an NCCL group");
  const int n = group.size();
  const std::string context = str_cat("issue_direct on ", group.describe());
  CPF_CHECK(send.is_contiguous() && recv.is_contiguous(), context, ": send and recv must be contiguous");
  CPF_CHECK(send.device() == nccl_group->device() && recv.device() == nccl_group->device(), context,
            ": send and recv must be on ", nccl_group->device());
  CPF_CHECK(send.dtype() == recv.dtype(), context, ": send is ", send.dtype(), " but recv is ", recv.dtype());
  const size_t count = static_cast<size_t>(send.numel());
  const size_t expected_recv = op == DirectOp::all_gather ? count * static_cast<size_t>(n) : count;
  CPF_CHECK(static_cast<size_t>(recv.numel()) == expected_recv, context, ": recv has ", recv.numel(),
            " elements, expected ", expected_recv);
  CPF_CHECK(op != DirectOp::all_to_all || count % static_cast<size_t>(n) == 0, context, ": ", count,
            " elements do not split evenly over ", n, " ranks");
  const int device = nccl_group->device().index;
  cuda::DeviceGuard guard(device);
  const cudaStream_t stream = cuda::current_cuda_stream(device);
  ncclComm_t comm = nccl_group->comm();
  const ncclDataType_t type = nccl_dtype(send.dtype());
  // Through run_nccl like the group's own calls: the communicator is non-blocking, so each call is
  // followed by the wait until NCCL has launched it (the same host cost on both sides of the benchmark).
  switch (op) {
    case DirectOp::all_reduce_sum:
      nccl_group->run_nccl(
          "ncclAllReduce",
          [&] { return ncclAllReduce(send.raw_data(), recv.raw_data(), count, type, ncclSum, comm, stream); }, context);
      break;
    case DirectOp::all_gather:
      nccl_group->run_nccl(
          "ncclAllGather", [&] { return ncclAllGather(send.raw_data(), recv.raw_data(), count, type, comm, stream); },
          context);
      break;
    case DirectOp::all_to_all: {
      const size_t piece = count / static_cast<size_t>(n);
      const size_t bytes = piece * dtype_size(send.dtype());
      const auto* from = static_cast<const char*>(send.raw_data());
      auto* to = static_cast<char*>(recv.raw_data());
      nccl_group->run_nccl(
          "grouped ncclSend/ncclRecv",
          [&] {
            return in_group([&] {
              for (int j = 0; j < n; ++j) {
                const size_t at = bytes * static_cast<size_t>(j);
                const ncclResult_t sent = ncclSend(from + at, piece, type, j, comm, stream);
                if (nccl_failed(sent)) return sent;
                const ncclResult_t received = ncclRecv(to + at, piece, type, j, comm, stream);
                if (nccl_failed(received)) return received;
              }
              return ncclSuccess;
            });
          },
          context);
      break;
    }
  }
}

}  // namespace cpf::dist::nccl
