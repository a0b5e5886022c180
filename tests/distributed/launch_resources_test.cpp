// launch under exhausted resources: a rank thread that cannot start, or a rank that runs out of
// memory, ends the launch with a cpf::Error naming the rank and what was being created, never with
// std::terminate or a bare "std::bad_alloc".
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <new>

#include "distributed/dist_test_utils.h"
#include "support/sanitizers.h"

namespace cpf::testing {
namespace {

// Bytes of address space this process maps now (/proc/self/statm, first field in pages).
size_t mapped_bytes() {
  std::ifstream statm("/proc/self/statm");
  size_t pages = 0;
  statm >> pages;
  return pages * 4096;
}

// In a death-test child: caps the address space at what is mapped now plus 48 MiB, so a few 8 MiB thread
// stacks fit and the rest cannot start, then launches 256 ranks. Exit 3 with the message on stderr.
[[noreturn]] void launch_with_capped_address_space() {
  rlim_t cap = mapped_bytes() + (rlim_t{48} << 20);
  rlimit current{};
  getrlimit(RLIMIT_AS, &current);
  if (current.rlim_max != RLIM_INFINITY && current.rlim_max < cap) cap = current.rlim_max;  // only lowered
  const rlimit limit{cap, cap};
  if (setrlimit(RLIMIT_AS, &limit) != 0) std::exit(5);
  try {
    dist::launch(256, [](RankContext& ctx) { ctx.world->barrier(); });
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::exit(3);
  }
  std::exit(0);
}

TEST(LaunchResources, ARankThreadThatCannotStartFailsTheLaunchWithItsRank) {
  // A sanitizer runtime reserves terabytes of shadow memory: an address-space limit breaks it.
  if (kSanitized) GTEST_SKIP() << "address-space limits are incompatible with the sanitizer runtime";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // Before the fix this was "terminate called without an active exception" (a std::thread vector
  // destroyed with running threads).
  // Whichever thread the limit stops first is named: a rank's own thread, or its progress thread.
  EXPECT_EXIT(
      launch_with_capped_address_space(), ::testing::ExitedWithCode(3),
      "launch: rank [0-9]+ failed: (could not start the thread of rank [0-9]+ of 256 \\(.*\\); lower the rank count "
      "\\(parallel.dp x parallel.cp\\) or raise the thread and memory limits \\(ulimit -u, ulimit -v\\)|thread "
      "backend: could not start the progress thread of rank [0-9]+ \\(.*\\); lower the rank count \\(parallel.dp x "
      "parallel.cp\\) or raise the thread limit \\(ulimit -u\\))");
}

TEST(LaunchResources, BadAllocInARankNamesTheRankAndThePhase) {
  EXPECT_CPF_ERROR(dist::launch(2,
                                [](RankContext& ctx) {
                                  if (ctx.rank == 1) throw std::bad_alloc();
                                  ctx.world->barrier();
                                }),
                   "launch: rank 1 failed: out of host memory (std::bad_alloc) while running with 2 rank(s) in this "
                   "process; lower the model or batch size or the rank count, or raise the memory limit");
  // The world is usable again afterwards: nothing of the failed launch is left behind.
  dist::launch(2, [](RankContext& ctx) { EXPECT_EQ(ctx.world->all_reduce(ones({1})).item<float>(), 2.0f); });
}

}  // namespace
}  // namespace cpf::testing
