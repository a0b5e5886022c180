// What a run does with the folder it starts in: resume: never refuses checkpoints it would leave
// behind, replace deletes them, a refused resume writes nothing and names the keys that differ,
// run.steps below the checkpoint is refused, a changed learning-rate schedule is reported, every step
// is recorded once after a resume, and a run whose gradients stay non-finite stops with an error.
#include <gtest/gtest.h>

#include "apps/run/resume_rules.h"
#include "framework/io/checkpoint.h"
#include "tests/apps/cli_support.h"

namespace cpf::trainer {
namespace {

namespace fs = std::filesystem;
using testing::read_file;
using testing::run;
using testing::scratch_dir;
using testing::write_file;

std::string yaml(const fs::path& out_dir) {
  return "run:\n  out_dir: " + out_dir.string() +
         "\n  steps: 4\n  log_every: 1\n  eval_every: 0\n  eval_batches: 1\n  eval_examples: 4\n  threads: 1\n"
         "model:\n  hidden_size: 32\n  num_layers: 2\n  num_heads: 4\n"
         "optimizer:\n  lr: 0.003\n"
         "data:\n  min_len: 1\n  max_len: 1\n  seq_len: 16\n  tokens_per_batch: 128\n  pad_multiple: 8\n";
}

// A config file in `dir` training into dir/run; returns its path.
std::string config_in(const fs::path& dir) {
  write_file(dir / "c.yaml", yaml(dir / "run"));
  return (dir / "c.yaml").string();
}

testing::CliResult train(const std::string& config, const std::vector<std::string>& overrides = {}) {
  std::vector<std::string> args = {"train", config};
  for (const std::string& o : overrides) args.insert(args.end(), {"--set", o});
  return run(args);
}

std::vector<int64_t> recorded_steps(const fs::path& metrics) {
  std::vector<int64_t> steps;
  std::istringstream in(read_file(metrics));
  for (std::string line; std::getline(in, line);) steps.push_back(std::stoll(line.substr(line.find("\"step\":") + 7)));
  return steps;
}

TEST(ResumeRules, NeverRefusesAFolderWithCheckpointsAndReplaceStartsOver) {
  const fs::path dir = scratch_dir("never");
  const std::string config = config_in(dir);
  ASSERT_EQ(train(config).code, kExitOk);
  const fs::path ckpts = dir / "run" / "checkpoints";
  const auto r = train(config, {"run.resume=never", "run.steps=2"});
  EXPECT_EQ(r.code, kExitError);
  EXPECT_NE(r.err.find("run.resume: never, but the run folder " + (dir / "run").string() +
                       " holds 1 checkpoint(s) "
                       "(newest " +
                       (ckpts / "step_00000004").string() +
                       "); a later run.resume: auto would continue "
                       "them instead of this run. Set run.resume: replace to delete them and start over"),
            std::string::npos)
      << r.err;
  EXPECT_TRUE(fs::exists(ckpts / "step_00000004"));

  const auto replaced = train(config, {"run.resume=replace", "run.steps=2"});
  ASSERT_EQ(replaced.code, kExitOk) << replaced.err;
  EXPECT_EQ(replaced.out.find("resumed"), std::string::npos) << replaced.out;
  EXPECT_NE(replaced.out.find("done: step 2/2"), std::string::npos) << replaced.out;
  EXPECT_EQ(io::list_checkpoints(ckpts.string()), std::vector<std::string>{(ckpts / "step_00000002").string()});
  EXPECT_EQ(recorded_steps(dir / "run" / "metrics.jsonl"), (std::vector<int64_t>{1, 2, 2}));
  // never into a folder without checkpoints starts over as before.
  EXPECT_EQ(train(config, {"run.resume=never", "run.out_dir=" + (dir / "fresh").string()}).code, kExitOk);
}

TEST(ResumeRules, ARefusedResumeNamesTheKeysThatDifferAndWritesNothing) {
  const fs::path dir = scratch_dir("differ");
  const std::string config = config_in(dir);
  ASSERT_EQ(train(config).code, kExitOk);
  const std::string yaml_before = read_file(dir / "run" / "config.yaml");
  const std::string metrics_before = read_file(dir / "run" / "metrics.jsonl");
  const auto r = train(config, {"model.hidden_size=64", "optimizer.lr=0.01", "run.steps=8"});
  EXPECT_EQ(r.code, kExitError);
  EXPECT_NE(r.err.find("resume: the newest checkpoint, " + (dir / "run" / "checkpoints" / "step_00000004").string() +
                       ", was written with another config: model.hidden_size: 32 in the checkpoint, 64 now; "
                       "optimizer.lr: 0.003 in the checkpoint, 0.01 now. Change them back to continue it, set "
                       "run.resume: replace"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(read_file(dir / "run" / "config.yaml"), yaml_before) << "config.yaml must keep the accepted config";
  EXPECT_EQ(read_file(dir / "run" / "metrics.jsonl"), metrics_before);
}

TEST(ResumeRules, StepsBelowTheCheckpointAreRefused) {
  const fs::path dir = scratch_dir("below");
  const std::string config = config_in(dir);
  ASSERT_EQ(train(config).code, kExitOk);
  const auto r = train(config, {"run.steps=2"});
  EXPECT_EQ(r.code, kExitError);
  EXPECT_NE(r.err.find("resume: run.steps=2 but the run folder's checkpoint " +
                       (dir / "run" / "checkpoints" / "step_00000004").string() +
                       " is at step 4, beyond it: there is nothing to train. Set run.steps to 4 or more"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.out.find("done:"), std::string::npos) << r.out;
}

TEST(ResumeRules, AScheduleThatMovesWithRunStepsIsReported) {
  const fs::path dir = scratch_dir("schedule");
  const std::string config = config_in(dir);
  ASSERT_EQ(train(config).code, kExitOk);  // cosine decay over run.steps = 4: step 5 would be at the floor
  const auto r = train(config, {"run.steps=8"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_NE(r.out.find("warning: the learning-rate schedule changed since the checkpoint of step 4: step 5 takes lr "
                       "1.650e-03 where the saved run's schedule gives 3.000e-04 (it decays over 8 steps now, 4 "
                       "before: schedule.total_steps 0 follows run.steps)"),
            std::string::npos)
      << r.out;
  // A constant schedule does not move: no warning.
  const fs::path other = scratch_dir("constant");
  const std::string constant = config_in(other);
  ASSERT_EQ(train(constant, {"schedule.decay=constant"}).code, kExitOk);
  const auto quiet = train(constant, {"schedule.decay=constant", "run.steps=8"});
  ASSERT_EQ(quiet.code, kExitOk) << quiet.err;
  EXPECT_EQ(quiet.out.find("warning"), std::string::npos) << quiet.out;
}

TEST(ResumeRules, MetricsHoldEachStepOnceAfterAResume) {
  const fs::path dir = scratch_dir("metrics");
  const std::string config = config_in(dir);
  ASSERT_EQ(train(config, {"run.checkpoint_every=2", "run.steps=5", "schedule.decay=constant"}).code, kExitOk);
  // The run died after step 5 was recorded but before its checkpoint: the resume starts at step 4.
  fs::remove_all(dir / "run" / "checkpoints" / "step_00000005");
  const auto resumed = train(config, {"run.checkpoint_every=2", "run.steps=6", "schedule.decay=constant"});
  ASSERT_EQ(resumed.code, kExitOk) << resumed.err;
  EXPECT_EQ(recorded_steps(dir / "run" / "metrics.jsonl"), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 6}));
  // A finished run started again evaluates for its summary but records nothing twice.
  const auto again = train(config, {"run.checkpoint_every=2", "run.steps=6", "schedule.decay=constant"});
  ASSERT_EQ(again.code, kExitOk) << again.err;
  EXPECT_NE(again.out.find("done: step 6/6"), std::string::npos) << again.out;
  EXPECT_EQ(recorded_steps(dir / "run" / "metrics.jsonl"), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 6}));
}

TEST(ResumeRules, ConsecutiveNonFiniteStepsStopTheRun) {
  // Plain SGD at lr 10 with momentum and no clipping overflows within a few steps: the gradient norm
  // turns NaN and every later update is skipped.
  const std::vector<std::string> diverge = {"optimizer.type=sgd", "optimizer.lr=10", "optimizer.momentum=0.99",
                                            "run.grad_clip=0", "run.steps=60"};
  const fs::path dir = scratch_dir("nonfinite");
  const std::string config = config_in(dir);
  auto overrides = diverge;
  overrides.push_back("run.max_nonfinite_steps=5");
  const auto r = train(config, overrides);
  EXPECT_EQ(r.code, kExitError);
  EXPECT_NE(r.err.find("consecutive steps (run.max_nonfinite_steps=5), every update skipped; stopping without a "
                       "checkpoint"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("the gradient norm was not finite ("), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("done:"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir / "run" / "checkpoints"));
  // 0 turns the stop off: the run ends (its updates skipped) as before.
  overrides.back() = "run.max_nonfinite_steps=0";
  overrides.push_back("run.out_dir=" + (dir / "off").string());
  const auto off = train(config, overrides);
  EXPECT_NE(off.out.find("update skipped"), std::string::npos) << off.out;
  EXPECT_NE(off.out.find("done: step 60/60"), std::string::npos) << off.out << off.err;
}

TEST(ResumeRules, ConfigDifferencesListOnlyTheKeysOfTheHash) {
  TrainConfig a = load_train_config_string(yaml("/tmp/x"), "a.yaml");
  TrainConfig b = a;
  EXPECT_EQ(config_differences(a, b), "");
  b.run.steps = 100;  // not part of what a checkpoint means
  b.run.log_every = 7;
  EXPECT_EQ(config_differences(a, b), "");
  b.run.seed = 5;
  b.data.task = "sort";
  EXPECT_EQ(config_differences(a, b),
            "data.task: addition in the checkpoint, sort now; run.seed: 1234 in the "
            "checkpoint, 5 now");
}

}  // namespace
}  // namespace cpf::trainer
