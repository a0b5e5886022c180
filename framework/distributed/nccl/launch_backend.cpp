// Backend::nccl for dist::launch: n rank threads, one GPU each (rank r on cuda:r), sharing one
// ncclUniqueId through memory. Registered from a static initialiser that the library's link option
// (--undefined=cpf_distributed_nccl_register) keeps in every program linking cpf_distributed_nccl.
#include <memory>
#include <mutex>
#include <vector>

#include "framework/core/error.h"
#include "framework/distributed/launcher.h"
#include "framework/distributed/nccl/nccl_check.cuh"
#include "framework/distributed/nccl/nccl_init.h"
#include "framework/distributed/nccl/nccl_process_group.cuh"
#include "framework/distributed/nccl/nccl_rank_state.cuh"
#include "framework/distributed/nccl/nccl_ready.cuh"
#include "framework/tensor/cuda/cuda.h"
#include "framework/tensor/cuda/runtime.cuh"

namespace cpf::dist::nccl {
namespace {

class NcclLaunchWorld final : public LaunchWorld {
 public:
  NcclLaunchWorld(int n_ranks, std::chrono::milliseconds timeout)
      : n_ranks_(n_ranks), timeout_(timeout), joined_(static_cast<size_t>(n_ranks), false) {
    const int gpus = cuda::device_count();
    CPF_CHECK(n_ranks <= gpus, "launch: the nccl backend runs one rank per GPU: ", n_ranks, " ranks need ", n_ranks,
              " GPUs but ", gpus, " are visible (CUDA_VISIBLE_DEVICES, or launch fewer ranks)");
    default_nvls_off();
    CPF_NCCL_CHECK(ncclGetUniqueId(&id_), nullptr, "launch (nccl backend)");
  }

  ProcessGroupPtr join(int rank, Device device) override {
    CPF_CHECK(device.is_cuda() && device.index == rank, "launch (nccl backend): rank ", rank,
              " must run on cuda:", rank, ", got ", device);
    // Joined before cudaSetDevice: creating this GPU's context can take long enough that a short
    // launch timeout would otherwise blame a rank that is only slow to start.
    {
      std::lock_guard lock(mutex_);
      joined_[static_cast<size_t>(rank)] = true;
    }
    // The rank thread stays on its GPU: NCCL and the kernels it launches without a guard use it.
    CPF_CUDA_CHECK(cudaSetDevice(rank));
    // Bounded: a rank that fails first aborts domain_, which stops the others at once, and one that
    // never gets here fails them at the launch timeout, named by absent_ranks().
    return create_world_group(rank, n_ranks_, id_, rank, timeout_, domain_,
                              {.absent = [this] { return absent_ranks(); },
                               .stalled = "every rank of the launch began creating its communicator, but NCCL did not "
                                          "connect them (NCCL_DEBUG=WARN tells more)"});
  }
  void abort(int rank, const std::string& reason) override { domain_->abort(rank, reason); }
  bool aborted() const override { return domain_->aborted(); }
  std::string abort_reason() const override { return domain_->reason(); }

 private:
  // The ranks whose threads have not reached world creation yet ("" when every rank has).
  std::string absent_ranks() const {
    std::vector<int> absent;
    {
      std::lock_guard lock(mutex_);
      for (int r = 0; r < n_ranks_; ++r) {
        if (!joined_[static_cast<size_t>(r)]) absent.push_back(r);
      }
    }
    if (absent.empty()) return "";
    const std::string who = absent.size() == 1 ? str_cat("rank ", absent[0]) : str_cat("ranks ", absent);
    return str_cat(who, " of the launch never began creating ", absent.size() == 1 ? "its" : "their",
                   " communicator (held elsewhere, or failed without aborting the launch)");
  }

  const int n_ranks_;
  const std::chrono::milliseconds timeout_;
  ncclUniqueId id_{};
  const std::shared_ptr<AbortDomain> domain_ = std::make_shared<AbortDomain>();
  mutable std::mutex mutex_;
  std::vector<bool> joined_;
};

}  // namespace

ProcessGroupPtr create_world_group(int rank, int world_size, const ncclUniqueId& id, int device,
                                   std::chrono::milliseconds timeout, std::shared_ptr<AbortDomain> domain,
                                   const CreationWatch& watch) {
  const std::string what = str_cat("NCCL world creation (rank ", rank, " of ", world_size, " on cuda:", device, ")");
  cuda::DeviceGuard guard(device);
  auto state = NcclRankState::create(device, rank, world_size, timeout, std::move(domain));
  // A rank of this process failed before this one got here: the others will not come.
  if (state->aborted()) CPF_FAIL(what, " stopped: the NCCL world was aborted (", state->domain()->reason(), ")");
  ncclComm_t comm = create_communicator(world_size, id, rank, timeout, *state->domain(), what, watch);
  std::vector<int> ranks(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) ranks[static_cast<size_t>(r)] = r;
  return std::make_shared<NcclProcessGroup>(std::move(state), comm, rank, std::move(ranks), "world", "world");
}

std::unique_ptr<LaunchWorld> make_launch_world(int n_ranks, const LaunchOptions& options) {
  return std::make_unique<NcclLaunchWorld>(n_ranks, options.timeout);
}

int nccl_version() {
  int version = 0;
  CPF_NCCL_CHECK(ncclGetVersion(&version), nullptr, "nccl_version");
  return version;
}

void register_launch_backend() { dist::register_launch_backend(Backend::nccl, make_launch_world); }

}  // namespace cpf::dist::nccl

// Referenced by the link option: keeps this object (and the initialiser below) in the program.
extern "C" void cpf_distributed_nccl_register() { cpf::dist::nccl::register_launch_backend(); }

namespace {
const bool cpf_nccl_registered = (cpf_distributed_nccl_register(), true);
}  // namespace
