// cpformer train --profile N / run.profile: the per-step table on the console and in profile.txt, and
// the refusals of a window that does not fit (config error, exit 2) or a bad --profile (usage, exit 2).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "tests/apps/cli_support.h"

namespace cpf::trainer {
namespace {

using testing::read_file;
using testing::run;
using testing::scratch_dir;
using testing::write_file;

// A 2-layer model on one-digit addition, one thread rank: a few fast steps.
std::filesystem::path write_config(const std::filesystem::path& dir, int64_t steps) {
  const std::filesystem::path config = dir / "tiny.yaml";
  write_file(config, "run:\n  out_dir: " + (dir / "run").string() + "\n  steps: " + std::to_string(steps) +
                         "\n  log_every: 1\n  eval_every: 0\n  eval_batches: 1\n  eval_examples: 0\n  threads: 1\n"
                         "model:\n  hidden_size: 32\n  num_layers: 2\n  num_heads: 4\n"
                         "schedule:\n  warmup_steps: 1\n"
                         "data:\n  min_len: 1\n  max_len: 1\n  seq_len: 16\n  tokens_per_batch: 64\n");
  return config;
}

TEST(ProfileCli, PrintsAndWritesTheTableOfTheWindow) {
  const auto dir = scratch_dir("profile");
  const auto config = write_config(dir, 5);
  const auto r = run({"train", config.string(), "--profile", "3"});
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("profile: steps 2-4 on cpu, per step"), std::string::npos) << r.out;
  for (const char* row : {"\nstep ", "phase/forward", "phase/backward", "phase/optimizer", "forward/linear",
                          "forward/attention", "forward/loss", "backward/linear"}) {
    EXPECT_NE(r.out.find(row), std::string::npos) << row << "\n" << r.out;
  }
  const std::string file = read_file(dir / "run" / "profile.txt");
  EXPECT_NE(file.find("profile: steps 2-4 on cpu"), std::string::npos) << file;
  EXPECT_NE(file.find("phase/backward"), std::string::npos) << file;
}

TEST(ProfileCli, AWindowPastTheRunIsAConfigError) {
  const auto dir = scratch_dir("too_long");
  const auto config = write_config(dir, 3);
  const auto r = run({"train", config.string(), "--set", "run.profile=3"});
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("run.profile=3 needs run.steps >= 4 (it profiles the steps after the first), got 3; lower it "
                       "to at most 2 or raise run.steps"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir / "run" / "profile.txt"));
}

TEST(ProfileCli, ABadProfileOptionIsAUsageError) {
  const auto dir = scratch_dir("bad_option");
  const auto config = write_config(dir, 3);
  for (const char* bad : {"0", "-2", "many"}) {
    const auto r = run({"train", config.string(), "--profile", bad});
    EXPECT_EQ(r.code, 2) << bad << ": " << r.out << r.err;
    EXPECT_NE(r.err.find("--profile"), std::string::npos) << r.err;
  }
}

}  // namespace
}  // namespace cpf::trainer
