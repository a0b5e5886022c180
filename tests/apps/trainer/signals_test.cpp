// SIGINT / SIGTERM while the real cpformer binary trains: a checkpoint of the step reached, where it
// is and how to resume, exit code 128 + signal, every thread rank taking part; a second signal ends the
// process at once. The resumed run continues from that checkpoint and records every step once.
#include <gtest/gtest.h>

#include <set>

#include "apps/trainer/stop_signals.h"
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

// A run far longer than any test waits for: it ends only by the signal. Constant learning rate, so a
// shorter resumed run has the same schedule.
std::string long_run_yaml(const fs::path& out_dir) {
  return "run:\n  out_dir: " + out_dir.string() +
         "\n  steps: 1000000\n  log_every: 1\n  eval_every: 0\n  eval_batches: 1\n  eval_examples: 4\n"
         "  threads: 1\n"
         "model:\n  hidden_size: 32\n  num_layers: 2\n  num_heads: 4\n"
         "schedule:\n  decay: constant\n"
         "data:\n  min_len: 1\n  max_len: 1\n  seq_len: 16\n  tokens_per_batch: 128\n  pad_multiple: 8\n";
}

// The step named in "stopped by SIG... after step N/1000000".
int64_t stopped_step(const std::string& out) {
  const size_t at = out.find(" after step ");
  return at == std::string::npos ? -1 : std::stoll(out.substr(at + 12));
}

// The "step" of every line of metrics.jsonl.
std::vector<int64_t> recorded_steps(const fs::path& metrics) {
  std::vector<int64_t> steps;
  std::istringstream in(read_file(metrics));
  for (std::string line; std::getline(in, line);) {
    const size_t at = line.find("\"step\":");
    if (at != std::string::npos) steps.push_back(std::stoll(line.substr(at + 7)));
  }
  return steps;
}

void expect_stop_and_resume(int signal, const std::vector<std::string>& overrides) {
  ASSERT_FALSE(testing::cpformer_binary().empty()) << "set CPF_CPFORMER_BIN to the cpformer binary";
  const fs::path dir = scratch_dir(stop_signal_name(signal));
  const fs::path config = dir / "long.yaml";
  write_file(config, long_run_yaml(dir / "run"));
  std::vector<std::string> args = {"train", config.string()};
  for (const std::string& o : overrides) args.insert(args.end(), {"--set", o});
  ChildProcess child(args, dir / "stdout.txt", dir / "stderr.txt");
  ASSERT_TRUE(child.wait_for_output("/1000000 | loss", 3)) << child.out() << child.err();
  ASSERT_EQ(::kill(child.pid(), signal), 0);
  const int code = child.wait();
  const std::string out = child.out(), err = child.err();
  EXPECT_EQ(code, stop_signal_exit_code(signal)) << out << err;
  EXPECT_NE(err.find(std::string("cpformer: ") + stop_signal_name(signal) +
                     " received: stopping after this step and writing a checkpoint"),
            std::string::npos)
      << err;
  const int64_t step = stopped_step(out);
  ASSERT_GE(step, 3) << out;
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(step));
  const fs::path checkpoint = dir / "run" / "checkpoints" / name;
  EXPECT_NE(out.find(std::string("stopped by ") + stop_signal_name(signal) + " after step " + std::to_string(step) +
                     "/1000000: checkpoint " + checkpoint.string()),
            std::string::npos)
      << out;
  EXPECT_TRUE(fs::exists(checkpoint / "meta.json")) << out;
  std::string resume = "resume with: cpformer train " + config.string();
  for (const std::string& o : overrides) resume += " --set " + o;
  EXPECT_NE(out.find(resume + "\n"), std::string::npos) << out;
  EXPECT_EQ(out.find("done:"), std::string::npos) << out;

  // The resume command continues from that checkpoint; metrics.jsonl then holds every step once.
  std::vector<std::string> again = {"train", config.string(), "--set", "run.steps=" + std::to_string(step + 2)};
  for (const std::string& o : overrides) again.insert(again.end(), {"--set", o});
  const auto resumed = run(again);
  ASSERT_EQ(resumed.code, kExitOk) << resumed.err;
  EXPECT_NE(resumed.out.find("resumed from " + checkpoint.string() + " at step " + std::to_string(step)),
            std::string::npos)
      << resumed.out;
  std::vector<int64_t> expected;
  for (int64_t s = 1; s <= step + 2; ++s) expected.push_back(s);
  expected.push_back(step + 2);  // the final evaluation's record
  EXPECT_EQ(recorded_steps(dir / "run" / "metrics.jsonl"), expected);
}

TEST(StopSignals, SigtermWritesACheckpointSaysHowToResumeAndExits143) { expect_stop_and_resume(SIGTERM, {}); }

TEST(StopSignals, SigintStopsEveryThreadRankTogetherAndExits130) {
  // dp=2 x cp=2: four rank threads agree on the step to stop after and all take part in the save.
  expect_stop_and_resume(SIGINT, {"parallel.dp=2", "parallel.cp=2"});
}

TEST(StopSignals, ASecondSignalExitsAtOnceWithoutACheckpoint) {
  ASSERT_FALSE(testing::cpformer_binary().empty()) << "set CPF_CPFORMER_BIN to the cpformer binary";
  const fs::path dir = scratch_dir("twice");
  write_file(dir / "long.yaml", long_run_yaml(dir / "run"));
  ChildProcess child({"train", (dir / "long.yaml").string()}, dir / "stdout.txt", dir / "stderr.txt");
  ASSERT_TRUE(child.wait_for_output("/1000000 | loss", 2)) << child.out() << child.err();
  // Stopped, the process receives both signals before it runs another instruction of its own: the
  // second one reaches the handler while the first is still only a flag.
  ASSERT_EQ(::kill(child.pid(), SIGSTOP), 0);
  ASSERT_EQ(::kill(child.pid(), SIGTERM), 0);
  ASSERT_EQ(::kill(child.pid(), SIGINT), 0);
  ASSERT_EQ(::kill(child.pid(), SIGCONT), 0);
  const int code = child.wait();
  const std::string out = child.out(), err = child.err();
  // Which of the two the kernel hands over first is its choice; the exit code names the second.
  ASSERT_TRUE(code == 130 || code == 143) << code << "\n" << out << err;
  const char* second = code == 130 ? "SIGINT" : "SIGTERM";
  EXPECT_NE(err.find(std::string("cpformer: second signal (") + second + "): exiting at once, no checkpoint written"),
            std::string::npos)
      << err;
  EXPECT_EQ(out.find("stopped by"), std::string::npos) << out;
  EXPECT_TRUE(io::list_checkpoints((dir / "run" / "checkpoints").string()).empty());
  // The lock died with the process: the folder takes a new run at once.
  const auto next = run({"train", (dir / "long.yaml").string(), "--set", "run.steps=2"});
  EXPECT_EQ(next.code, kExitOk) << next.err;
}

TEST(StopSignals, ASignalIgnoredAtStartStaysIgnored) {
  ASSERT_FALSE(testing::cpformer_binary().empty()) << "set CPF_CPFORMER_BIN to the cpformer binary";
  const fs::path dir = scratch_dir("ignored");
  write_file(dir / "long.yaml", long_run_yaml(dir / "run"));
  ChildProcess child({"train", (dir / "long.yaml").string()}, dir / "stdout.txt", dir / "stderr.txt", SIGTERM);
  ASSERT_TRUE(child.wait_for_output("/1000000 | loss", 2)) << child.out() << child.err();
  ASSERT_EQ(::kill(child.pid(), SIGTERM), 0);
  // Still training some steps later (the stderr note of a caught signal never comes).
  const size_t lines = child.out().size();
  ASSERT_TRUE(child.wait_for_output("/1000000 | loss", 20)) << child.out() << child.err();
  EXPECT_GT(child.out().size(), lines);
  EXPECT_EQ(child.err().find("SIGTERM received"), std::string::npos) << child.err();
  // SIGINT was not ignored: it stops the run as usual.
  ASSERT_EQ(::kill(child.pid(), SIGINT), 0);
  EXPECT_EQ(child.wait(), 130) << child.out() << child.err();
  EXPECT_NE(child.out().find("stopped by SIGINT after step "), std::string::npos) << child.out();
}

// 512 thread ranks take seconds to start (a model each, on a share of a core): the run warns, and a
// signal in that time ends it promptly (nothing trained, nothing to save), not after the start.
TEST(StopSignals, ManyThreadRanksWarnAndStopPromptlyDuringSetup) {
  ASSERT_FALSE(testing::cpformer_binary().empty()) << "set CPF_CPFORMER_BIN to the cpformer binary";
  const fs::path dir = scratch_dir("crowded");
  write_file(dir / "long.yaml", long_run_yaml(dir / "run"));
  ChildProcess child(
      {"train", (dir / "long.yaml").string(), "--set", "parallel.dp=512", "--set", "data.tokens_per_batch=8192"},
      dir / "stdout.txt", dir / "stderr.txt");
  ASSERT_TRUE(child.wait_for_output("warning: 512 thread ranks on ")) << child.out() << child.err();
  const auto sent = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(child.pid(), SIGTERM), 0);
  const int code = child.wait();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count();
  const std::string out = child.out();
  EXPECT_EQ(code, 143) << out << child.err();
  EXPECT_NE(out.find("use fewer ranks (parallel.dp x parallel.cp)"), std::string::npos) << out;
  EXPECT_NE(out.find("stopped by SIGTERM during setup, before the first step: nothing to save"), std::string::npos)
      << out;
  EXPECT_NE(out.find("resume with: cpformer train "), std::string::npos) << out;
  EXPECT_LT(seconds, 3.0) << out;
  EXPECT_TRUE(io::list_checkpoints((dir / "run" / "checkpoints").string()).empty());
}

TEST(StopSignals, ResumeCommandQuotesAndOverridesTheStartOverModes) {
  EXPECT_EQ(resume_command("cfg.yaml", {"run.steps=10"}, std::nullopt, ResumeMode::auto_resume),
            "cpformer train cfg.yaml --set run.steps=10");
  EXPECT_EQ(resume_command("my runs/it's.yaml", {"run.name=a b"}, std::string("4"), ResumeMode::never),
            "cpformer train 'my runs/it'\\''s.yaml' --set 'run.name=a b' --gpus 4 --set run.resume=auto");
  EXPECT_EQ(resume_command("c.yaml", {}, std::nullopt, ResumeMode::replace),
            "cpformer train c.yaml --set run.resume=auto");
}

}  // namespace
}  // namespace cpf::trainer
