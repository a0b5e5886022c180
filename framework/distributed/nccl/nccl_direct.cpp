#include "framework/distributed/nccl/nccl_direct.h"

#include "framework/core/error.h"
#include "framework/distributed/nccl/nccl_check.cuh"
#include "framework/distributed/nccl/nccl_process_group.cuh"
#include "framework/tensor/cuda/runtime.cuh"

namespace cpf::dist::nccl {

void issue_direct(ProcessGroup& group, DirectOp op, const Tensor& send, const Tensor& recv) {
  auto* nccl_group = dynamic_cast<NcclProcessGroup*>(&group);
  CPF_CHECK(nccl_group != nullptr, "issue_direct: ", group.describe(), " is a ", group.backend(),
            " group, not an NCCL group");
  const int n = group.size();
  const std::string context = detail::str_cat("issue_direct on ", group.describe());
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
  switch (op) {
    case DirectOp::all_reduce_sum:
      CPF_NCCL_CHECK(ncclAllReduce(send.raw_data(), recv.raw_data(), count, type, ncclSum, comm, stream), comm,
                     context);
      break;
    case DirectOp::all_gather:
      CPF_NCCL_CHECK(ncclAllGather(send.raw_data(), recv.raw_data(), count, type, comm, stream), comm, context);
      break;
    case DirectOp::all_to_all: {
      const size_t piece = count / static_cast<size_t>(n);
      const size_t bytes = piece * dtype_size(send.dtype());
      CPF_NCCL_CHECK(ncclGroupStart(), comm, context);
      for (int j = 0; j < n; ++j) {
        CPF_NCCL_CHECK(ncclSend(static_cast<const char*>(send.raw_data()) + bytes * static_cast<size_t>(j), piece, type,
                                j, comm, stream),
                       comm, context);
        CPF_NCCL_CHECK(ncclRecv(static_cast<char*>(recv.raw_data()) + bytes * static_cast<size_t>(j), piece, type, j,
                                comm, stream),
                       comm, context);
      }
      CPF_NCCL_CHECK(ncclGroupEnd(), comm, context);
      break;
    }
  }
}

}  // namespace cpf::dist::nccl
