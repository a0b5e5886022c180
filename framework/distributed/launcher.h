#pragma once
// launch: run a function on N ranks, as threads of this process, over the thread backend.
//
//   dist::launch(4, [&](dist::RankContext& ctx) {
//     Tensor x = ones({8}, {.device = ctx.device});
//     Tensor total = ctx.world->all_reduce(x);
//   });
//
// Each rank runs on its own thread, bound to its device (cpu, or cuda:i when a CUDA backend is
// present), with OpenMP limited to max(1, cores / n) threads so N ranks do not oversubscribe the
// machine. launch joins every rank and then, if any failed, throws one cpf::Error naming the rank
// that failed first and its message. A failing rank aborts the world: the other ranks leave their
// pending collectives at once with an error that names it, instead of waiting for the timeout.
//
// LaunchOptions::backend = Backend::nccl gives each rank an NCCL world on cuda:rank instead (link
// cpf_distributed_nccl; one GPU per rank): launch(2, fn, {.backend = dist::Backend::nccl}).
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "framework/distributed/process_group.h"
#include "framework/tensor/device.h"

namespace cpf::dist {

struct RankContext {
  int rank = 0;
  int world_size = 1;
  Device device;          // this rank's device: create its tensors here
  ProcessGroupPtr world;  // this rank's handle on the world group
};

enum class DevicePolicy {
  automatic,  // cuda:(rank % device count) when a CUDA backend with devices is present, else cpu
  cpu,
  cuda,  // cuda:(rank % device count); an error when there is no CUDA device
};

enum class Backend {
  thread,  // the thread backend (framework/distributed/thread): any device, ranks meet in host memory
  nccl,    // one NCCL communicator per rank on cuda:rank (needs cpf_distributed_nccl linked in and n GPUs)
};
const char* backend_name(Backend backend);

struct LaunchOptions {
  std::chrono::milliseconds timeout = kDefaultTimeout;  // bound of every wait in every group
  DevicePolicy devices = DevicePolicy::automatic;
  int omp_threads_per_rank = 0;       // 0: max(1, cores / n_ranks)
  Backend backend = Backend::thread;  // nccl implies DevicePolicy::cuda with rank r on cuda:r
};

void launch(int n_ranks, const std::function<void(RankContext&)>& fn, const LaunchOptions& options = {});

// The device rank `rank` is bound to under `policy` (what launch puts in RankContext::device).
Device rank_device(int rank, DevicePolicy policy);

}  // namespace cpf::dist

namespace cpf::dist {

// ---- backends other than thread plug into launch() here ----
// A world of n ranks being launched: created once on the launching thread, then each rank thread
// calls join() for its world group. The NCCL backend (framework/distributed/nccl) registers one when
// its library is linked; launch() reports a clear error when the requested backend is missing.
class LaunchWorld {
 public:
  virtual ~LaunchWorld() = default;
  // On rank `rank`'s thread, with `device` already chosen; collective over the n rank threads.
  virtual ProcessGroupPtr join(int rank, Device device) = 0;
  // Fails every pending and future operation of every rank, naming `rank` and `reason` (first call wins).
  virtual void abort(int rank, const std::string& reason) = 0;
  virtual bool aborted() const = 0;
  virtual std::string abort_reason() const = 0;
};
using LaunchWorldFactory = std::function<std::unique_ptr<LaunchWorld>(int n_ranks, const LaunchOptions& options)>;
void register_launch_backend(Backend backend, LaunchWorldFactory factory);
bool has_launch_backend(Backend backend);

}  // namespace cpf::dist
