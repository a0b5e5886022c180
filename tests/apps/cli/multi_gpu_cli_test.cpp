// Multi-GPU entry points of the CLI that need no GPU to check: `--gpus N` (device, backend and dp it
// implies, and its usage errors), parallel.backend validation, and a process started by a launcher
// (RANK/WORLD_SIZE/... in the environment) with a config that cannot run that way. The runs on GPUs
// are in tests/distributed/nccl.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "apps/cli/cli.h"
#include "tests/apps/cli_support.h"

namespace cpf::trainer {
namespace {

using testing::repo_root;
using testing::run;
using testing::scratch_dir;
using testing::write_file;

std::string default_config() { return (repo_root() / "configs/default.yaml").string(); }

// Sets environment variables for one scope and restores what was there.
class ScopedEnv {
 public:
  explicit ScopedEnv(std::vector<std::pair<std::string, std::string>> vars) {
    for (auto& [name, value] : vars) {
      const char* old = std::getenv(name.c_str());
      saved_.push_back({name, old ? std::optional<std::string>(old) : std::nullopt});
      ::setenv(name.c_str(), value.c_str(), 1);
    }
  }
  ~ScopedEnv() {
    for (const auto& [name, old] : saved_) {
      if (old) {
        ::setenv(name.c_str(), old->c_str(), 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

TEST(CliGpus, ImpliesCudaNcclAndDataParallelRanks) {
  // default.yaml has cp=2: 4 GPUs give dp=2.
  const auto r = run({"check-config", default_config(), "--gpus", "4"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_NE(r.out.find("parallel: dp=2 cp=2 backend nccl"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("compute: cuda"), std::string::npos) << r.out;
  // Matching the config's own rank count keeps dp; the = form works too.
  const auto same = run({"check-config", default_config(), "--gpus=2"});
  ASSERT_EQ(same.code, kExitOk) << same.err;
  EXPECT_NE(same.out.find("parallel: dp=1 cp=2 backend nccl"), std::string::npos) << same.out;
}

TEST(CliGpus, BadCountsAreUsageErrors) {
  auto expect_usage = [](const std::vector<std::string>& args, const std::string& message) {
    const auto r = run(args);
    EXPECT_EQ(r.code, kExitConfig) << r.out;
    EXPECT_NE(r.err.find("cpformer: " + message), std::string::npos) << r.err;
  };
  expect_usage({"check-config", default_config(), "--gpus", "3"},
               "--gpus 3 is not a multiple of parallel.cp=2 (ranks = parallel.dp x parallel.cp)");
  expect_usage({"train", default_config(), "--gpus", "0"}, "--gpus 0: expected at least 1 GPU");
  expect_usage({"train", default_config(), "--gpus", "two"}, "--gpus two: expected a number");
  expect_usage({"train", default_config(), "--gpus"}, "--gpus needs a value");
  expect_usage({"generate", "dir", "--gpus", "2"}, "'generate' takes no --gpus");
  expect_usage(
      {"check-config", default_config(), "--gpus", "4", "--set", "parallel.dp=1"},
      "--gpus 4 and --set parallel.dp=1 disagree: ranks = parallel.dp x parallel.cp = 1 x 2; drop one of them");
}

TEST(CliGpus, WithoutAGpuTrainingStopsWithTheFix) {
  // This machine (CI, development) has no GPU, or the build has no CUDA backend: either way the
  // message names run.device=cuda and how to proceed.
  const auto r =
      run({"train", default_config(), "--gpus", "2", "--set", "run.out_dir=" + scratch_dir("gpus").string()});
  if (r.code == kExitOk) GTEST_SKIP() << "a GPU is visible: tests/distributed/nccl covers training on it";
  EXPECT_EQ(r.code, kExitError);
  EXPECT_NE(r.err.find("run.device=cuda: "), std::string::npos) << r.err;
}

TEST(CliParallelBackend, NcclNeedsCudaDevices) {
  const auto dir = scratch_dir("nccl");
  const std::string path = (dir / "x.yaml").string();
  write_file(path, "parallel:\n  backend: nccl\n");
  const auto r = run({"check-config", path});
  EXPECT_EQ(r.code, kExitConfig);
  EXPECT_NE(r.err.find("parallel.backend=nccl nccl runs one rank per GPU but run.device=cpu; set run.device: cuda"),
            std::string::npos)
      << r.err;
  write_file(path, "parallel:\n  backend: mpi\n");
  const auto bad = run({"check-config", path});
  EXPECT_EQ(bad.code, kExitConfig);
  EXPECT_NE(bad.err.find("parallel.backend=mpi is not one of: thread, nccl"), std::string::npos) << bad.err;
}

TEST(CliLauncher, ProcessStartedByALauncherNeedsTheNcclBackend) {
  ScopedEnv env({{"RANK", "1"},
                 {"WORLD_SIZE", "2"},
                 {"LOCAL_RANK", "1"},
                 {"MASTER_ADDR", "127.0.0.1"},
                 {"MASTER_PORT", "29511"}});
  const auto r = run({"train", default_config(), "--set", "run.out_dir=" + scratch_dir("launcher").string()});
  EXPECT_EQ(r.code, kExitError);
  EXPECT_NE(r.err.find("cpformer train was started by torchrun as rank 1 of 2, but parallel.backend is thread"),
            std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace cpf::trainer
