// One-rank training reads its steps back in windows (step_window.h, docs/training.md "Host
// synchronisation in a step"): a run with step lines far apart must record every step once and in
// order, write checkpoints of settled steps only, stop on run.max_nonfinite_steps at the same step and
// stop on a signal after recording every step it ran, exactly as a run that reads back every step
// (log_every 1: every step is a read-back point).
#include <gtest/gtest.h>

#include <cmath>
#include <csignal>

#include "apps/trainer/step/step_window.h"
#include "apps/trainer/stop_signals.h"
#include "apps/trainer/trainer.h"
#include "framework/io/checkpoint.h"
#include "support/test_utils.h"
#include "tests/apps/child_process.h"
#include "tests/apps/cli_support.h"

namespace cpf::trainer {
namespace {

namespace fs = std::filesystem;
using testing::addition_yaml;
using testing::read_file;
using testing::scratch_dir;

struct TrainRun {
  TrainOutcome outcome;
  std::string out;
};

TrainRun train_with(const fs::path& dir, int64_t steps, const std::vector<std::string>& overrides) {
  const TrainConfig c = load_train_config_string(addition_yaml(dir, steps), "test.yaml", overrides);
  std::ostringstream out;
  TrainRun r;
  r.outcome = train(c, out);
  r.out = out.str();
  return r;
}

// The lines of `text` that contain `what`, in order.
std::vector<std::string> lines_with(const std::string& text, const std::string& what) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.find(what) != std::string::npos) out.push_back(line);
  }
  return out;
}

TEST(StepWindow, ReadsTheStepsBackInOrderAsAPerStepReadBack) {
  StepWindow window(Device::cpu());
  EXPECT_CPF_ERROR(window.read(), "StepWindow::read: no step since the last read");
  const double sums[3] = {4.0, NAN, INFINITY};
  const float losses[3] = {1.25f, 2.5f, 1.0f / 3.0f};
  for (int i = 0; i < 3; ++i) {
    window.add(full({1}, sums[i], {.dtype = DType::f64}), scalar_tensor(losses[i], {.dtype = DType::f32}), 10 + i);
  }
  EXPECT_EQ(window.size(), 3);
  const std::vector<StepResult> r = window.read();
  EXPECT_TRUE(window.empty());
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].grad_norm, 2.0);
  EXPECT_FALSE(r[0].skipped);
  EXPECT_TRUE(r[1].skipped);
  EXPECT_TRUE(r[2].skipped);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(r[i].loss, static_cast<double>(losses[i])) << i;  // f32 widened exactly, as item<double>()
    EXPECT_EQ(r[i].tokens, 10 + i) << i;
  }
}

TEST(StepWindow, RejectsWhatDoesNotFit) {
  StepWindow window(Device::cpu());
  const Tensor sum = full({1}, 1.0, {.dtype = DType::f64}), loss = scalar_tensor(1.0, {.dtype = DType::f32});
  EXPECT_CPF_ERROR(window.add(full({1}, 1.0), loss, 1), "StepWindow::add: the sum of squares must be one f64 element");
  EXPECT_CPF_ERROR(window.add(sum, zeros({2}), 1), "StepWindow::add: the loss must be one floating element");
  for (int64_t i = 0; i < StepWindow::kCapacity; ++i) window.add(sum, loss, 1);
  EXPECT_TRUE(window.full());
  EXPECT_CPF_ERROR(window.add(sum, loss, 1), "StepWindow::add: 32 steps are in flight already; read() them first");
  EXPECT_EQ(window.read().size(), 32u);
}

// 45 steps, step lines every 40: windows end at 32 (full), 40 (step line) and 45 (last step). Every
// step's loss, the step lines, the evaluation and the tokens equal the run that reads every step back.
TEST(StepWindow, AWindowedRunRecordsEveryStepOnceInOrder) {
  const std::vector<std::string> common = {"run.eval_every=20", "schedule.total_steps=0"};
  auto with = [&](const std::string& log_every) {
    auto o = common;
    o.push_back("run.log_every=" + log_every);
    return o;
  };
  const TrainRun each = train_with(scratch_dir("each"), 45, with("1"));
  const TrainRun windowed = train_with(scratch_dir("windowed"), 45, with("40"));
  ASSERT_EQ(each.outcome.losses.size(), 45u);
  EXPECT_EQ(windowed.outcome.losses, each.outcome.losses);  // bit for bit, none dropped, repeated or moved
  EXPECT_EQ(windowed.outcome.tokens_seen, each.outcome.tokens_seen);
  ASSERT_TRUE(windowed.outcome.last_eval && each.outcome.last_eval);
  EXPECT_EQ(windowed.outcome.last_eval->loss, each.outcome.last_eval->loss);
  // The last step line covers steps 41..45: its mean is the summary's train loss.
  double mean = 0;
  for (size_t i = 40; i < 45; ++i) mean += each.outcome.losses[i];
  EXPECT_EQ(windowed.outcome.train_loss_steps, 5);
  ASSERT_TRUE(windowed.outcome.train_loss.has_value());
  EXPECT_DOUBLE_EQ(*windowed.outcome.train_loss, mean / 5);
  EXPECT_EQ(lines_with(windowed.out, " | lr ").size(), 2u) << windowed.out;  // step lines 40 and 45
}

// Checkpoints every 6 steps with step lines every 100: a checkpoint must hold its steps settled (the
// optimizer's count of applied steps), so resuming from it continues the uninterrupted run bit for bit.
TEST(StepWindow, CheckpointsHoldSettledStepsOnly) {
  const fs::path full_dir = scratch_dir("full"), split_dir = scratch_dir("split");
  const std::vector<std::string> o = {"run.log_every=100", "run.checkpoint_every=6"};
  const TrainRun full = train_with(full_dir, 12, {"run.log_every=1"});
  const TrainRun first = train_with(split_dir, 6, o);
  const auto checkpoints = io::list_checkpoints((split_dir / "checkpoints").string());
  ASSERT_EQ(checkpoints.size(), 1u);
  EXPECT_EQ(io::read_checkpoint_meta(checkpoints.back()).optimizer_step, 6);
  const TrainRun second = train_with(split_dir, 12, o);
  EXPECT_EQ(second.outcome.start_step, 6);
  ASSERT_EQ(first.outcome.losses.size() + second.outcome.losses.size(), full.outcome.losses.size());
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(first.outcome.losses[i], full.outcome.losses[i]) << "step " << i + 1;
    EXPECT_EQ(second.outcome.losses[i], full.outcome.losses[i + 6]) << "step " << i + 7;
  }
}

// A diverging run: run.max_nonfinite_steps fires at the same step with the same message, after the same
// "update skipped" notes, whether the steps are read back one by one or in windows.
TEST(StepWindow, MaxNonfiniteStepsFiresAtTheSameStep) {
  const std::vector<std::string> diverge = {"optimizer.type=sgd",      "optimizer.lr=10",
                                            "optimizer.momentum=0.99", "run.grad_clip=0",
                                            "schedule.total_steps=0",  "run.max_nonfinite_steps=5"};
  auto failure = [&](const std::string& name, const std::string& log_every) {
    auto o = diverge;
    o.push_back("run.log_every=" + log_every);
    const TrainConfig c = load_train_config_string(addition_yaml(scratch_dir(name), 60), "test.yaml", o);
    std::ostringstream out;
    std::string message;
    try {
      train(c, out);
    } catch (const Error& e) {
      message = e.message();
    }
    // Up to the run folder, which differs.
    return std::make_pair(message.substr(0, message.find(" (the newest in ")), lines_with(out.str(), "update skipped"));
  };
  const auto each = failure("each", "1"), windowed = failure("windowed", "50");
  ASSERT_NE(each.first.find("consecutive steps (run.max_nonfinite_steps=5)"), std::string::npos) << each.first;
  EXPECT_EQ(windowed.first, each.first);
  EXPECT_EQ(windowed.second, each.second);
  EXPECT_GE(each.second.size(), 5u);
}

// SIGTERM between step lines: the steps since the last read-back are read, recorded and settled before
// the stop's checkpoint.
TEST(StepWindow, ASignalReadsTheWindowBackBeforeTheCheckpoint) {
  ASSERT_FALSE(testing::cpformer_binary().empty()) << "set CPF_CPFORMER_BIN to the cpformer binary";
  const fs::path dir = scratch_dir("signal");
  testing::write_file(dir / "long.yaml", addition_yaml(dir / "run", 1000000));
  testing::ChildProcess child({"train", (dir / "long.yaml").string(), "--set", "run.log_every=7"}, dir / "stdout.txt",
                              dir / "stderr.txt");
  ASSERT_TRUE(child.wait_for_output("/1000000 | loss", 3)) << child.out() << child.err();
  ASSERT_EQ(::kill(child.pid(), SIGTERM), 0);
  EXPECT_EQ(child.wait(), stop_signal_exit_code(SIGTERM)) << child.out() << child.err();
  const std::string out = child.out();
  const size_t at = out.find(" after step ");
  ASSERT_NE(at, std::string::npos) << out;
  const int64_t step = std::stoll(out.substr(at + 12));
  const auto checkpoints = io::list_checkpoints((dir / "run" / "checkpoints").string());
  ASSERT_EQ(checkpoints.size(), 1u) << out;
  const io::CheckpointMeta meta = io::read_checkpoint_meta(checkpoints.back());
  EXPECT_EQ(meta.step, step);
  EXPECT_EQ(meta.optimizer_step, step);  // every step applied and settled before the checkpoint
}

}  // namespace
}  // namespace cpf::trainer
