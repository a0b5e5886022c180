// Backend::nccl for dist::launch: n rank threads, one GPU each (rank r on cuda:r), sharing one
// ncclUniqueId through memory. Registered from a static initialiser that the library's link option
// (--undefined=cpf_distributed_nccl_register) keeps in every program linking cpf_distributed_nccl.
#include <memory>

#include "framework/core/error.h"
#include "framework/distributed/launcher.h"
#include "framework/distributed/nccl/nccl_check.cuh"
#include "framework/distributed/nccl/nccl_init.h"
#include "framework/distributed/nccl/nccl_process_group.cuh"
#include "framework/distributed/nccl/nccl_rank_state.cuh"
#include "framework/tensor/cuda/cuda.h"
#include "framework/tensor/cuda/runtime.cuh"

namespace cpf::dist::nccl {
namespace {

class NcclLaunchWorld final : public LaunchWorld {
 public:
  NcclLaunchWorld(int n_ranks, std::chrono::milliseconds timeout) : n_ranks_(n_ranks), timeout_(timeout) {
    const int gpus = cuda::device_count();
    CPF_CHECK(n_ranks <= gpus, "launch: the nccl backend runs one rank per GPU: ", n_ranks, " ranks need ", n_ranks,
              " GPUs but ", gpus, " are visible (CUDA_VISIBLE_DEVICES, or launch fewer ranks)");
    default_nvls_off();
    CPF_NCCL_CHECK(ncclGetUniqueId(&id_), nullptr, "launch (nccl backend)");
  }

  ProcessGroupPtr join(int rank, Device device) override {
    CPF_CHECK(device.is_cuda() && device.index == rank, "launch (nccl backend): rank ", rank,
              " must run on cuda:", rank, ", got ", device);
    // The rank thread stays on its GPU: NCCL and the kernels it launches without a guard use it.
    CPF_CUDA_CHECK(cudaSetDevice(rank));
    return create_world_group(rank, n_ranks_, id_, rank, timeout_, domain_);
  }
  void abort(int rank, const std::string& reason) override { domain_->abort(rank, reason); }
  bool aborted() const override { return domain_->aborted(); }
  std::string abort_reason() const override { return domain_->reason(); }

 private:
  const int n_ranks_;
  const std::chrono::milliseconds timeout_;
  ncclUniqueId id_{};
  const std::shared_ptr<AbortDomain> domain_ = std::make_shared<AbortDomain>();
};

}  // namespace

ProcessGroupPtr create_world_group(int rank, int world_size, const ncclUniqueId& id, int device,
                                   std::chrono::milliseconds timeout, std::shared_ptr<AbortDomain> domain) {
  const std::string context = detail::str_cat("nccl: creating the world of ", world_size, " ranks on rank ", rank);
  cuda::DeviceGuard guard(device);
  auto state = NcclRankState::create(device, rank, world_size, timeout, std::move(domain));
  ncclComm_t comm = nullptr;
  // Blocking: every rank must get here (the in-process launch starts them together; the TCP
  // rendezvous of init_from_environment has seen every rank alive before).
  CPF_NCCL_CHECK(ncclCommInitRank(&comm, world_size, id, rank), comm, context);
  std::vector<int> ranks(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) ranks[static_cast<size_t>(r)] = r;
  return std::make_shared<NcclProcessGroup>(std::move(state), comm, rank, std::move(ranks), "world");
}

int nccl_version() {
  int version = 0;
  CPF_NCCL_CHECK(ncclGetVersion(&version), nullptr, "nccl_version");
  return version;
}

void register_launch_backend() {
  dist::register_launch_backend(Backend::nccl, [](int n_ranks, const LaunchOptions& options) {
    return std::unique_ptr<LaunchWorld>(new NcclLaunchWorld(n_ranks, options.timeout));
  });
}

}  // namespace cpf::dist::nccl

// Referenced by the link option: keeps this object (and the initialiser below) in the program.
extern "C" void cpf_distributed_nccl_register() { cpf::dist::nccl::register_launch_backend(); }

namespace {
const bool cpf_nccl_registered = (cpf_distributed_nccl_register(), true);
}  // namespace
