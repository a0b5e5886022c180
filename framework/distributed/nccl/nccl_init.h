#pragma once
// The NCCL backend's entry points (library cpf_distributed_nccl; no CUDA or NCCL header included).
//
// One process per GPU, started by torchrun, srun, mpirun or dist::spawn_local_processes:
//
//   dist::RankContext ctx = dist::init_from_environment();   // reads RANK/WORLD_SIZE/... (environment.h)
//   Tensor x = ones({8}, {.device = ctx.device});             // ctx.device = cuda:LOCAL_RANK
//   ctx.world->all_reduce_(x);
//
// Rank 0 creates the ncclUniqueId and hands it to every rank through the TCP rendezvous on
// MASTER_ADDR:MASTER_PORT (rendezvous_tcp.h); the rendezvous then stays open as a liveness channel:
// when a rank's process ends without closing it (crash, kill), every other rank aborts its NCCL
// world with a message naming that rank, so no rank hangs on a dead peer.
//
// In one process, one thread per GPU: dist::launch(n, fn, {.backend = dist::Backend::nccl})
// (launcher.h), which this library registers when it is linked.
#include <chrono>
#include <memory>

#include "framework/distributed/environment.h"
#include "framework/distributed/launcher.h"

namespace cpf::dist {

struct NcclInitOptions {
  // Bound of every collective's completion (an operation older than this aborts the world), of
  // new_group, and of NCCL world creation after the rendezvous (there at least 60 s: every rank met,
  // and NCCL's own setup of a large world takes seconds).
  std::chrono::milliseconds timeout = kDefaultTimeout;
  // Bound of the rendezvous: how long rank 0 waits for the others, and they for rank 0.
  std::chrono::milliseconds rendezvous_timeout = kDefaultTimeout;
};

// Joins the NCCL world described by the launcher's environment variables (read_launch_environment):
// binds this process to cuda:LOCAL_RANK and returns its world group. Throws a message naming what
// is missing or inconsistent, the ranks that never arrived, or NCCL's error.
RankContext init_from_environment(const NcclInitOptions& options = {});
// The same from an explicit description (tests, programs with their own configuration).
RankContext init_nccl_world(const LaunchEnvironment& env, const NcclInitOptions& options = {});

namespace nccl {
// The NCCL library's version at run time, e.g. 22809 for 2.28.9.
int nccl_version();
// The world of n rank threads that dist::launch(n, fn, {.backend = Backend::nccl}) uses (what this
// library registers): rank r joins on cuda:r; creation is bounded by options.timeout and stops when
// another rank aborts the launch first. For programs and tests that drive the rank threads themselves.
std::unique_ptr<LaunchWorld> make_launch_world(int n_ranks, const LaunchOptions& options);
}  // namespace nccl

}  // namespace cpf::dist
