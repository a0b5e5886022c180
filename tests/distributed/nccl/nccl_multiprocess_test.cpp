// One process per GPU through the launcher environment: dist::spawn_local_processes starts this
// test binary again as its children (NcclMultiProcessChild.Run, which only runs as a child), each
// joining the world with dist::init_from_environment over the TCP rendezvous.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "framework/distributed/process_launcher.h"
#include "framework/tensor/ops/join.h"
#include "tests/distributed/nccl/nccl_test_utils.h"

namespace cpf::testing {
namespace {

constexpr const char* kChildVar = "CPF_NCCL_TEST_CHILD";

std::string self_executable() {
  char path[4096];
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0) return "";
  path[n] = '\0';
  return path;
}

// The same checks as the in-process suite, smaller: the environment path must give the same results.
void child_collectives(RankContext& ctx) {
  const int n = ctx.world_size;
  const auto inputs = all_inputs(n, [&](int r) { return make_input({6, 5}, DType::f32, 2000 + r); });
  const Tensor x = on_device(inputs[ctx.rank], ctx.device);
  if (!matches(ctx.world->all_reduce(x), reference_reduce(inputs, ReduceOp::sum), 1e-6)) std::exit(10);
  if (!matches(ctx.world->all_gather(x, 1), raw::cat(inputs, 1), 0)) std::exit(11);
  if (!matches(ctx.world->broadcast(x, n - 1), inputs[static_cast<size_t>(n - 1)], 0)) std::exit(12);
  const Tensor got = zeros({6, 5}, {.device = ctx.device});
  ctx.world->batch_p2p({dist::P2POp::send(x, (ctx.rank + 1) % n), dist::P2POp::recv(got, (ctx.rank + n - 1) % n)});
  if (!matches(got, inputs[static_cast<size_t>((ctx.rank + n - 1) % n)], 0)) std::exit(13);
  ctx.world->barrier();
  std::printf("CHILD OK rank %d of %d on %s\n", ctx.rank, n, ctx.device.str().c_str());
  std::fflush(stdout);
}

// Rank 1 dies without a word after the first barrier; rank 0 must leave its hanging all_reduce
// with a message naming rank 1, long before the 60 s operation timeout.
void child_die(RankContext& ctx) {
  if (ctx.rank == 1) {
    ctx.world->barrier();
    std::_Exit(3);
  }
  try {
    ctx.world->barrier();  // may already see rank 1 gone: its exit can beat our side of the barrier
    const Tensor x = ones({1024}, {.device = ctx.device});
    for (int i = 0; i < 100; ++i) {
      Tensor y = ctx.world->all_reduce(x);
      (void)y.to_vector<float>();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  } catch (const Error& e) {
    std::printf("CHILD CAUGHT: %s\n", e.what());
    std::fflush(stdout);
    std::_Exit(4);
  }
  std::printf("CHILD NOT FAILED\n");
  std::fflush(stdout);
  std::_Exit(5);
}

TEST(NcclMultiProcessChild, Run) {
  const char* mode = std::getenv(kChildVar);
  if (!mode) GTEST_SKIP() << "runs only as a child of the NcclMultiProcess tests (" << kChildVar << " unset)";
  if (std::string(mode) == "die") std::signal(SIGTERM, SIG_IGN);  // stay to report, as a survivor would
  RankContext ctx = dist::init_from_environment(
      {.timeout = std::chrono::seconds(60), .rendezvous_timeout = std::chrono::seconds(60)});
  ASSERT_EQ(ctx.world->backend(), "nccl");
  if (std::string(mode) == "collectives") child_collectives(ctx);
  if (std::string(mode) == "die") child_die(ctx);
}

class NcclMultiProcess : public MultiGpuTest {
 protected:
  dist::SpawnResult spawn(const std::string& mode, std::chrono::milliseconds grace = std::chrono::seconds(5)) {
    const std::string exe = self_executable();
    EXPECT_FALSE(exe.empty());
    dist::SpawnOptions options;
    options.extra_env = {{kChildVar, mode}};
    options.grace = grace;
    options.output = [this](int rank, std::string_view line) {
      std::lock_guard lock(mutex_);
      lines_.push_back("[rank " + std::to_string(rank) + "] " + std::string(line));
    };
    return dist::spawn_local_processes(2, {exe, "--gtest_filter=NcclMultiProcessChild.Run"}, options);
  }
  std::string output() {
    std::lock_guard lock(mutex_);
    std::string all;
    for (const auto& l : lines_) all += l + "\n";
    return all;
  }
  std::mutex mutex_;
  std::vector<std::string> lines_;
};

TEST_F(NcclMultiProcess, TwoProcessesThroughTheEnvironment) {
  const dist::SpawnResult result = spawn("collectives");
  const std::string out = output();
  EXPECT_EQ(result.exit_code, 0) << result.message << "\n" << out;
  EXPECT_NE(out.find("CHILD OK rank 0 of 2 on cuda:0"), std::string::npos) << out;
  EXPECT_NE(out.find("CHILD OK rank 1 of 2 on cuda:1"), std::string::npos) << out;
}

TEST_F(NcclMultiProcess, KilledRankIsNamedByTheSurvivor) {
  const auto start = std::chrono::steady_clock::now();
  const dist::SpawnResult result = spawn("die", std::chrono::seconds(40));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::string out = output();
  // The launcher names both deaths; which it blames first is a heuristic (rank 1's GPU teardown can
  // outlast rank 0's reaction to it), so either order passes.
  EXPECT_TRUE(result.failed_rank == 1 || result.failed_rank == 0) << result.message << "\n" << out;
  EXPECT_NE(result.exit_code, 0) << result.message;
  EXPECT_NE(result.message.find("rank 1 exited with status 3"), std::string::npos) << result.message;
  EXPECT_NE(result.message.find("rank 0 exited with status 4"), std::string::npos) << result.message;
  EXPECT_NE(out.find("[rank 0] CHILD CAUGHT"), std::string::npos) << out;
  EXPECT_NE(out.find("rank 1 failed: its process ended"), std::string::npos) << out;
  EXPECT_LT(seconds, 30.0) << "rank 0 should notice rank 1's death through the rendezvous, not wait for SIGKILL\n"
                           << out;
}

}  // namespace
}  // namespace cpf::testing
