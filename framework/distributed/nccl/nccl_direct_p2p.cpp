// issue_direct_p2p and BlockingCommunicator (nccl_direct.h): a batch of sends and receives straight
// to NCCL, on the group's non-blocking communicator or on a blocking one made for the purpose.
#include <cstring>

#include "framework/core/error.h"
#include "framework/distributed/nccl/nccl_check.cuh"
#include "framework/distributed/nccl/nccl_direct.h"
#include "framework/distributed/nccl/nccl_process_group.cuh"
#include "framework/distributed/nccl/nccl_ready.cuh"
#include "framework/tensor/cuda/runtime.cuh"

namespace cpf::dist::nccl {
namespace {

NcclProcessGroup& as_nccl_group(ProcessGroup& group, const char* who) {
  auto* nccl_group = dynamic_cast<NcclProcessGroup*>(&group);
  CPF_CHECK(nccl_group != nullptr, who, ": ", group.describe(), " is a ", group.backend(), " group, not an NCCL group");
  return *nccl_group;
}

// What NCCL needs and cannot check itself: defined, contiguous tensors on `device`, peers in range.
void check_p2p(const std::vector<P2POp>& ops, Device device, int size, const std::string& context) {
  for (size_t i = 0; i < ops.size(); ++i) {
    const P2POp& op = ops[i];
    const char* kind = op.kind == P2POp::Kind::send ? "send" : "recv";
    CPF_CHECK(op.tensor.defined(), context, ": op ", i, " (", kind, ") has an undefined tensor");
    CPF_CHECK(op.tensor.is_contiguous(), context, ": op ", i, " (", kind, ") has a non-contiguous tensor of shape ",
              op.tensor.shape(), "; pass raw::contiguous(t) (the direct path does not stage)");
    CPF_CHECK(op.tensor.device() == device, context, ": op ", i, " (", kind, ") is on ", op.tensor.device(),
              " but the communicator runs on ", device);
    CPF_CHECK(op.peer >= 0 && op.peer < size, context, ": op ", i, " (", kind, ") names peer ", op.peer,
              ", out of range for ", size, " ranks (expected 0..", size - 1, ")");
  }
}

// ncclGroupStart, one ncclSend / ncclRecv per op (empty ones skipped), ncclGroupEnd.
ncclResult_t post_p2p(const std::vector<P2POp>& ops, ncclComm_t comm, cudaStream_t stream) {
  return in_group([&] {
    for (const P2POp& op : ops) {
      if (op.tensor.numel() == 0) continue;
      const size_t count = static_cast<size_t>(op.tensor.numel());
      const ncclDataType_t type = nccl_dtype(op.tensor.dtype());
      void* data = op.tensor.raw_data();
      const ncclResult_t status = op.kind == P2POp::Kind::send ? ncclSend(data, count, type, op.peer, comm, stream)
                                                               : ncclRecv(data, count, type, op.peer, comm, stream);
      if (nccl_failed(status)) return status;
    }
    return ncclSuccess;
  });
}

}  // namespace

void issue_direct_p2p(ProcessGroup& group, const std::vector<P2POp>& ops) {
  NcclProcessGroup& g = as_nccl_group(group, "issue_direct_p2p");
  const std::string context = str_cat("issue_direct_p2p on ", group.describe());
  check_p2p(ops, g.device(), g.size(), context);
  const int device = g.device().index;
  cuda::DeviceGuard guard(device);
  const cudaStream_t stream = cuda::current_cuda_stream(device);
  const ncclComm_t comm = g.comm();
  g.run_nccl(
      "grouped ncclSend/ncclRecv", [&] { return post_p2p(ops, comm, stream); }, context);
}

struct BlockingCommunicator::Impl {
  ncclComm_t comm = nullptr;
  Device device;
  int size = 0;
  std::string what;     // "BlockingCommunicator over group 'world' (global ranks [0,1])"
  bool failed = false;  // a failed communicator is aborted, not destroyed
};

BlockingCommunicator::BlockingCommunicator(ProcessGroup& group) : impl_(std::make_unique<Impl>()) {
  NcclProcessGroup& g = as_nccl_group(group, "BlockingCommunicator");
  impl_->device = g.device();
  impl_->size = g.size();
  impl_->what = str_cat("BlockingCommunicator over ", group.describe());
  // The unique id travels as 16 int64 words of the group's device.
  ncclUniqueId id{};
  static_assert(sizeof(ncclUniqueId) % sizeof(int64_t) == 0);
  std::vector<int64_t> words(sizeof(ncclUniqueId) / sizeof(int64_t), 0);
  if (g.rank() == 0) {
    CPF_NCCL_CHECK(ncclGetUniqueId(&id), nullptr, impl_->what);
    std::memcpy(words.data(), &id, sizeof(id));
  }
  const Tensor shared = from_vector(words, {static_cast<int64_t>(words.size())}, g.device());
  group.broadcast_(shared, 0);
  words = shared.to_vector<int64_t>();
  std::memcpy(&id, words.data(), sizeof(id));
  cuda::DeviceGuard guard(impl_->device.index);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 1;
  ncclComm_t comm = nullptr;
  const ncclResult_t status = ncclCommInitRankConfig(&comm, g.size(), id, g.rank(), &config);
  if (status != ncclSuccess) {
    if (comm != nullptr) (void)ncclCommAbort(comm);
    throw_nccl_error(__FILE__, __LINE__, "ncclCommInitRankConfig (blocking)", status, nullptr, impl_->what);
  }
  impl_->comm = comm;
}

BlockingCommunicator::~BlockingCommunicator() {
  if (impl_->comm == nullptr) return;
  QuietDeviceGuard guard(impl_->device.index);
  (void)(impl_->failed ? ncclCommAbort(impl_->comm) : ncclCommDestroy(impl_->comm));
}

void BlockingCommunicator::batch_p2p(const std::vector<P2POp>& ops) {
  CPF_CHECK(!impl_->failed, impl_->what, ": an earlier call failed; the communicator cannot be used again");
  check_p2p(ops, impl_->device, impl_->size, impl_->what);
  cuda::DeviceGuard guard(impl_->device.index);
  const cudaStream_t stream = cuda::current_cuda_stream(impl_->device.index);
  const ncclResult_t status = post_p2p(ops, impl_->comm, stream);
  if (status != ncclSuccess) {
    impl_->failed = true;
    throw_nccl_error(__FILE__, __LINE__, "grouped ncclSend/ncclRecv", status, impl_->comm, impl_->what);
  }
}

}  // namespace cpf::dist::nccl
