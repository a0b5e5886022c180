// launch: one thread per rank, each bound to its device with a bounded OpenMP team, joined, and the
// first failure rethrown with its rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>
#include <set>
#include <thread>

#include "distributed/dist_test_utils.h"

#if defined(CPF_WITH_OPENMP)
#include <omp.h>
#endif

namespace cpf::testing {
namespace {

TEST(LauncherTest, RunsEveryRankOnItsOwnThreadWithItsContext) {
  for (int n : {1, 3, 8}) {
    std::mutex mutex;
    std::set<std::thread::id> threads;
    std::set<int> ranks;
    dist::launch(n, [&](RankContext& ctx) {
      EXPECT_EQ(ctx.world_size, n);
      EXPECT_EQ(ctx.world->size(), n);
      EXPECT_EQ(ctx.world->rank(), ctx.rank);
      EXPECT_EQ(ctx.world->name(), "world");
      EXPECT_EQ(ctx.world->backend(), "thread");
      // The CPU unless a CUDA backend is linked and a GPU is visible.
      EXPECT_EQ(ctx.device, dist::rank_device(ctx.rank, dist::DevicePolicy::automatic));
      std::lock_guard lock(mutex);
      threads.insert(std::this_thread::get_id());
      ranks.insert(ctx.rank);
    });
    EXPECT_EQ(static_cast<int>(threads.size()), n);
    EXPECT_EQ(static_cast<int>(ranks.size()), n);
    EXPECT_EQ(threads.count(std::this_thread::get_id()), 0u);
  }
}

TEST(LauncherTest, PassesTheTimeoutToEveryGroup) {
  dist::launch(2,
               [](RankContext& ctx) {
                 EXPECT_EQ(ctx.world->timeout(), 1234ms);
                 EXPECT_EQ(ctx.world->new_group({1, 0})->timeout(), 1234ms);
               },
               {.timeout = 1234ms});
}

TEST(LauncherTest, LimitsOpenMpThreadsPerRank) {
#if defined(CPF_WITH_OPENMP)
  const int cores = omp_get_num_procs();
  for (int n : {1, 2, 4}) {
    dist::launch(n, [&](RankContext&) { EXPECT_EQ(omp_get_max_threads(), std::max(1, cores / n)); });
  }
  dist::launch(2, [](RankContext&) { EXPECT_EQ(omp_get_max_threads(), 3); }, {.omp_threads_per_rank = 3});
#else
  GTEST_SKIP() << "built without OpenMP";
#endif
}

TEST(LauncherTest, BindsDevicesByPolicy) {
  EXPECT_EQ(dist::rank_device(3, dist::DevicePolicy::cpu), Device::cpu());
  const bool backend = has_device_backend(DeviceType::cuda);
  const int gpus = backend ? device_backend(DeviceType::cuda).device_count() : 0;
  if (gpus > 0) {  // a CUDA build on a GPU machine: ranks go round the visible GPUs
    EXPECT_EQ(dist::rank_device(3, dist::DevicePolicy::automatic), Device::cuda(3 % gpus));
    EXPECT_EQ(dist::rank_device(3, dist::DevicePolicy::cuda), Device::cuda(3 % gpus));
    return;
  }
  EXPECT_EQ(dist::rank_device(3, dist::DevicePolicy::automatic), Device::cpu());
  EXPECT_CPF_ERROR(dist::rank_device(0, dist::DevicePolicy::cuda),
                   backend ? "launch: cuda devices were requested but no CUDA device is visible"
                           : "launch: cuda devices were requested but this build has no CUDA backend");
  EXPECT_CPF_ERROR(dist::launch(2, [](RankContext&) {}, {.devices = dist::DevicePolicy::cuda}),
                   "launch: cuda devices were requested");
}

TEST(LauncherTest, RethrowsTheFirstFailureWithItsRank) {
  EXPECT_CPF_ERROR(dist::launch(3,
                                [](RankContext& ctx) {
                                  if (ctx.rank == 1) CPF_FAIL("bad batch ", 17);
                                }),
                   "launch: rank 1 failed: bad batch 17");
  // A second launch after a failed one works: each launch has its own world.
  dist::launch(2, [](RankContext& ctx) { EXPECT_EQ(ctx.world->all_reduce(ones({1})).item<float>(), 2.0f); });
}

}  // namespace
}  // namespace cpf::testing
