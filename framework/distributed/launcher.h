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
#include <chrono>
#include <functional>

#include "framework/distributed/process_group.h"
#include "framework/tensor/device.h"

namespace cpf::dist {

struct RankContext {
  int rank = 0;
  int world_size = 1;
  Device device;         // this rank's device: create its tensors here
  ProcessGroupPtr world;  // this rank's handle on the world group
};

enum class DevicePolicy {
  automatic,  // cuda:(rank % device count) when a CUDA backend with devices is present, else cpu
  cpu,
  cuda,       // cuda:(rank % device count); an error when there is no CUDA device
};

struct LaunchOptions {
  std::chrono::milliseconds timeout = kDefaultTimeout;  // bound of every wait in every group
  DevicePolicy devices = DevicePolicy::automatic;
  int omp_threads_per_rank = 0;  // 0: max(1, cores / n_ranks)
};

void launch(int n_ranks, const std::function<void(RankContext&)>& fn, const LaunchOptions& options = {});

// The device rank `rank` is bound to under `policy` (what launch puts in RankContext::device).
Device rank_device(int rank, DevicePolicy policy);

}  // namespace cpf::dist
