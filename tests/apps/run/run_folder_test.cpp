// The run folder under contention and on a full disk: a second trainer is refused naming the PID that
// holds the folder, and a write that fails (config.yaml, metrics.jsonl, the console log) stops the run
// at once with the path and the OS error. A full disk is /dev/full standing in for the file.
#include <gtest/gtest.h>
#include <unistd.h>

#include "apps/run/run_folder.h"
#include "framework/io/checkpoint.h"
#include "tests/apps/child_process.h"
#include "tests/apps/cli_support.h"

namespace cpf::trainer {
namespace {

namespace fs = std::filesystem;
using testing::ChildProcess;
using testing::read_file;
using testing::run;
using testing::scratch_dir;
using testing::write_file;

std::string yaml(const fs::path& out_dir, int64_t steps) {
  return "run:\n  out_dir: " + out_dir.string() + "\n  steps: " + std::to_string(steps) +
         "\n  log_every: 1\n  eval_every: 0\n  eval_batches: 1\n  eval_examples: 4\n  threads: 1\n"
         "model:\n  hidden_size: 32\n  num_layers: 2\n  num_heads: 4\n"
         "data:\n  min_len: 1\n  max_len: 1\n  seq_len: 16\n  tokens_per_batch: 128\n  pad_multiple: 8\n";
}

std::string in_use_message(const fs::path& run, const std::string& pid) {
  return "cpformer: error: the run folder " + run.string() + " is in use by another cpformer train (PID " + pid +
         ", lock " + (run / ".lock").string() +
         "); wait for it to finish or stop it, or give this run another "
         "folder (run.out_dir or run.name)";
}

TEST(RunFolder, ASecondTrainerInTheSameFolderIsRefusedNamingThePid) {
  const fs::path dir = scratch_dir("lock");
  write_file(dir / "c.yaml", yaml(dir / "run", 3));
  {
    // Held in this process (flock is per open file, so a second open here conflicts like another process).
    RunFolderLock held((dir / "run").string());
    EXPECT_EQ(read_file(dir / "run" / ".lock"), std::to_string(::getpid()) + "\n");
    const auto r = run({"train", (dir / "c.yaml").string()});
    EXPECT_EQ(r.code, kExitError);
    EXPECT_NE(r.err.find(in_use_message(dir / "run", std::to_string(::getpid()))), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(dir / "run" / "config.yaml")) << "a refused trainer writes nothing";
  }
  // Released with its holder: the folder trains now.
  const auto r = run({"train", (dir / "c.yaml").string()});
  EXPECT_EQ(r.code, kExitOk) << r.err;
}

TEST(RunFolder, ALiveTrainerProcessKeepsOthersOut) {
  ASSERT_FALSE(testing::cpformer_binary().empty()) << "set CPF_CPFORMER_BIN to the cpformer binary";
  const fs::path dir = scratch_dir("process");
  write_file(dir / "c.yaml", yaml(dir / "run", 1000000));
  ChildProcess first({"train", (dir / "c.yaml").string()}, dir / "stdout.txt", dir / "stderr.txt");
  ASSERT_TRUE(first.wait_for_output("/1000000 | loss")) << first.out() << first.err();
  const auto second = run({"train", (dir / "c.yaml").string(), "--set", "run.steps=5"});
  EXPECT_EQ(second.code, kExitError);
  EXPECT_NE(second.err.find(in_use_message(dir / "run", std::to_string(first.pid()))), std::string::npos) << second.err;
  ASSERT_EQ(::kill(first.pid(), SIGTERM), 0);
  EXPECT_EQ(first.wait(), 143) << first.out() << first.err();
}

TEST(RunFolder, ConfigYamlOnAFullDiskStopsBeforeTraining) {
  const fs::path dir = scratch_dir("config");
  fs::create_directories(dir / "run");
  // config.yaml is written to config.yaml.tmp and renamed: the temporary file is the one that fills up.
  fs::create_symlink("/dev/full", dir / "run" / "config.yaml.tmp");
  write_file(dir / "c.yaml", yaml(dir / "run", 3));
  const auto r = run({"train", (dir / "c.yaml").string()});
  EXPECT_EQ(r.code, kExitError);
  const fs::path target = dir / "run" / "config.yaml";
  EXPECT_NE(
      r.err.find("cannot write " + target.string() + " (via " + target.string() + ".tmp): No space left on device"),
      std::string::npos)
      << r.err;
  EXPECT_EQ(r.out.find("| loss"), std::string::npos) << "no step may train: " << r.out;
  EXPECT_FALSE(fs::exists(target));
  EXPECT_FALSE(fs::exists(dir / "run" / "checkpoints"));
}

TEST(RunFolder, MetricsOnAFullDiskStopAtTheFirstRecord) {
  const fs::path dir = scratch_dir("metrics");
  fs::create_directories(dir / "run");
  fs::create_symlink("/dev/full", dir / "run" / "metrics.jsonl");
  write_file(dir / "c.yaml", yaml(dir / "run", 5));
  const auto r = run({"train", (dir / "c.yaml").string()});
  EXPECT_EQ(r.code, kExitError);
  EXPECT_NE(r.err.find("cannot write " + (dir / "run" / "metrics.jsonl").string() + ": No space left on device"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.out.find("step 2/5"), std::string::npos) << "training went on: " << r.out;
  EXPECT_FALSE(fs::exists(dir / "run" / "checkpoints"));
}

TEST(RunFolder, AConsoleLogOnAFullDiskStopsTheRun) {
  ASSERT_FALSE(testing::cpformer_binary().empty()) << "set CPF_CPFORMER_BIN to the cpformer binary";
  const fs::path dir = scratch_dir("stdout");
  write_file(dir / "c.yaml", yaml(dir / "run", 5));
  ChildProcess child({"train", (dir / "c.yaml").string()}, "/dev/full", dir / "stderr.txt");
  EXPECT_EQ(child.wait(), kExitError);
  EXPECT_NE(child.err().find("cpformer: error: cannot write the training log to standard output (/dev/full): No "
                             "space left on device"),
            std::string::npos)
      << child.err();
  EXPECT_FALSE(fs::exists(dir / "run" / "checkpoints"));
}

}  // namespace
}  // namespace cpf::trainer
