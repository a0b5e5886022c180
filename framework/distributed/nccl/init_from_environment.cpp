// init_from_environment: one process per GPU, meeting through the TCP rendezvous.
#include <cstring>

#include "framework/core/error.h"
#include "framework/distributed/nccl/nccl_check.cuh"
#include "framework/distributed/nccl/nccl_init.h"
#include "framework/distributed/nccl/nccl_process_group.cuh"
#include "framework/distributed/rendezvous_tcp.h"
#include "framework/tensor/cuda/cuda.h"
#include "framework/tensor/cuda/runtime.cuh"

namespace cpf::dist {

RankContext init_from_environment(const NcclInitOptions& options) {
  const std::optional<LaunchEnvironment> env = read_launch_environment();
  CPF_CHECK(env.has_value(), "init_from_environment: no launcher variables are set (RANK/WORLD_SIZE/LOCAL_RANK/",
            "MASTER_ADDR/MASTER_PORT from torchrun or spawn_local_processes, SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID ",
            "from srun, or OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK from mpirun); start the program through a launcher");
  return init_nccl_world(*env, options);
}

RankContext init_nccl_world(const LaunchEnvironment& env, const NcclInitOptions& options) {
  const std::string context =
      str_cat("init_from_environment (", env.launcher, ", rank ", env.rank, " of ", env.world_size, ")");
  const int gpus = cuda::device_count();
  // One visible GPU (srun --gpus-per-task=1, or CUDA_VISIBLE_DEVICES set per process): it is this rank's,
  // whatever the local rank; otherwise local rank r takes cuda:r.
  const int gpu = gpus == 1 ? 0 : env.local_rank;
  CPF_CHECK(gpu < gpus, context, ": local rank ", env.local_rank, " needs cuda:", env.local_rank, " but ", gpus,
            " GPUs are visible; start at most ", gpus, " ranks per node");
  CPF_CUDA_CHECK(cudaSetDevice(gpu));
  nccl::default_nvls_off();
  std::string id_bytes;
  if (env.rank == 0) {
    ncclUniqueId id;
    CPF_NCCL_CHECK(ncclGetUniqueId(&id), nullptr, context);
    id_bytes.assign(id.internal, sizeof id.internal);
  }
  std::unique_ptr<TcpRendezvous> rendezvous =
      TcpRendezvous::join({.host = env.master_addr,
                           .port = env.rendezvous_port > 0 ? env.rendezvous_port : env.master_port,
                           .rank = env.rank,
                           .world_size = env.world_size,
                           .payload = id_bytes,
                           .timeout = options.rendezvous_timeout,
                           .token = env.rendezvous_token,
                           .bind = env.rendezvous_bind});
  CPF_CHECK(rendezvous->payload().size() == sizeof(ncclUniqueId), context, ": the rendezvous delivered ",
            rendezvous->payload().size(), " bytes instead of an ncclUniqueId (", sizeof(ncclUniqueId), ")");
  ncclUniqueId id;
  std::memcpy(id.internal, rendezvous->payload().data(), sizeof id.internal);
  auto domain = std::make_shared<nccl::AbortDomain>();
  // The rendezvous connections now tell this rank when a peer process dies, from world creation on
  // (which then stops at once, naming it); the rendezvous lives as long as the world group (attached
  // to it), and saying goodbye at its end keeps finished ranks from being blamed.
  rendezvous->watch([domain](int rank, const std::string& reason) { domain->abort(rank, reason); });
  // Every rank met at the rendezvous, so none is known missing: creation gets at least kCreationFloor.
  const nccl::CreationWatch watch{
      .absent = {},
      .stalled = str_cat("every rank met at the rendezvous on ", env.master_addr, ":", env.master_port,
                         " and none has died since, so a rank stalls before creating its communicator, or "
                         "NCCL cannot connect the ranks (NCCL_DEBUG=WARN tells more)")};
  ProcessGroupPtr world = nccl::create_world_group(env.rank, env.world_size, id, gpu, options.timeout, domain, watch);
  auto* group = static_cast<nccl::NcclProcessGroup*>(world.get());
  group->attach(std::shared_ptr<void>(std::move(rendezvous)));
  return {.rank = env.rank, .world_size = env.world_size, .device = Device::cuda(gpu), .world = world};
}

}  // namespace cpf::dist
