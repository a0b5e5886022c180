// End-to-end training through the trainer: learning happens, every (dp, cp) layout takes the same
// steps as one rank, resume is bit-exact, and a crash while writing a checkpoint loses nothing.
#include <gtest/gtest.h>

#include <cmath>

#include "apps/cli/train_summary.h"
#include "apps/run/checkpointing.h"
#include "apps/trainer/trainer.h"
#include "framework/io/checkpoint.h"
#include "tests/apps/cli_support.h"

namespace cpf::trainer {
namespace {

using testing::addition_yaml;
using testing::read_file;
using testing::repo_root;
using testing::run;
using testing::scratch_dir;

// One-digit addition, a 2-layer model, 128-token batches padded for cp up to 4.
std::string base_yaml(const std::filesystem::path& out_dir, int64_t steps) { return addition_yaml(out_dir, steps); }

TrainOutcome train_with(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  const TrainConfig c = load_train_config_string(yaml, "test.yaml", overrides);
  std::ostringstream out;
  return train(c, out);
}

void expect_same_losses(const std::vector<double>& actual, const std::vector<double>& expected, double rtol,
                        const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_LE(std::abs(actual[i] - expected[i]), rtol * std::abs(expected[i]))
        << what << ": step " << i + 1 << " loss " << actual[i] << " vs " << expected[i];
  }
}

TEST(Train, LossDecreasesOnTheTinyConfig) {
  const auto dir = scratch_dir("run");
  const auto r = run({"train", (repo_root() / "configs" / "tiny.yaml").string(), "--set", "run.out_dir=" + dir.string(),
                      "--set", "run.threads=1"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_NE(r.out.find("step 20/20 | loss "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("exact match"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("done: step 20/20"), std::string::npos) << r.out;
  // The summary carries the session's rate; MFU only where the GPU's peak is known (never on the CPU).
  const std::string done = r.out.substr(r.out.find("done: step 20/20"));
  EXPECT_NE(done.find(" tok/s | "), std::string::npos) << done;
  EXPECT_EQ(done.find("MFU"), std::string::npos) << done;
  // metrics.jsonl: one line per logging step (every 5) and per evaluation (10, 20).
  const std::string metrics = read_file(dir / "metrics.jsonl");
  EXPECT_EQ(std::count(metrics.begin(), metrics.end(), '\n'), 4 + 2) << metrics;
  EXPECT_NE(metrics.find("\"accuracy\""), std::string::npos);
  // config.yaml is the effective config and reads back.
  const TrainConfig back = load_train_config((dir / "config.yaml").string());
  EXPECT_EQ(back.run.steps, 20);
  EXPECT_EQ(back.model.vocab_size, 14);

  const TrainOutcome o = train_with(base_yaml(scratch_dir("direct"), 20), {"schedule.total_steps=0"});
  ASSERT_EQ(o.losses.size(), 20u);
  const double first = (o.losses[0] + o.losses[1] + o.losses[2]) / 3;
  const double last = (o.losses[17] + o.losses[18] + o.losses[19]) / 3;
  EXPECT_LT(last, 0.85 * first) << "first " << first << " last " << last;
  EXPECT_FALSE(o.target_set);
  ASSERT_TRUE(o.last_eval && o.last_eval->loss && o.last_eval->accuracy);
  EXPECT_EQ(o.last_eval->num_examples, 8);
}

TEST(Train, ContextParallelStepsMatchOneRank) {
  const auto reference = train_with(base_yaml(scratch_dir("cp1"), 5)).losses;
  ASSERT_EQ(reference.size(), 5u);
  struct Case {
    const char* comm;
    int cp;
  };
  for (const Case& c : {Case{"p2p", 2}, Case{"all_gather", 2}, Case{"a2a", 2}, Case{"a2a+p2p", 4}}) {
    const auto losses = train_with(base_yaml(scratch_dir(c.comm), 5), {"parallel.cp=" + std::to_string(c.cp),
                                                                       std::string("parallel.cp_comm_type=") + c.comm})
                            .losses;
    expect_same_losses(losses, reference, 1e-5, std::string("cp_comm_type ") + c.comm);
  }
}

TEST(Train, DataParallelMatchesOneRankWithTheDoubledBatch) {
  // bshd document rows: DP rank r of a step gets global batch 2s + r, i.e. the rows that one rank with
  // the doubled batch gets in one piece.
  const std::string bshd = "  layout: bshd\n  batch_size: 4\n";
  std::string yaml = base_yaml(scratch_dir("dp1"), 5);
  yaml.replace(yaml.find("  tokens_per_batch: 128\n"), 24, "");
  const auto reference = train_with(yaml + bshd, {"data.batch_size=8"}).losses;
  const auto dp2 = train_with(yaml + bshd, {"parallel.dp=2", "run.out_dir=" + scratch_dir("dp2").string()}).losses;
  expect_same_losses(dp2, reference, 1e-5, "dp=2");
  const auto dp2cp2 =
      train_with(yaml + bshd, {"parallel.dp=2", "parallel.cp=2", "run.out_dir=" + scratch_dir("dp2cp2").string()})
          .losses;
  expect_same_losses(dp2cp2, reference, 1e-5, "dp=2 x cp=2");
}

TEST(Train, ResumeReproducesTheUninterruptedRunBitForBit) {
  const auto full_dir = scratch_dir("full"), split_dir = scratch_dir("split");
  const auto full = train_with(base_yaml(full_dir, 6), {"run.checkpoint_every=3", "parallel.cp=2"});
  ASSERT_EQ(full.losses.size(), 6u);
  EXPECT_EQ(io::list_checkpoints((full_dir / "checkpoints").string()).size(), 2u);

  const auto first = train_with(base_yaml(split_dir, 3), {"parallel.cp=2"});
  ASSERT_EQ(first.losses.size(), 3u);
  const auto second = train_with(base_yaml(split_dir, 6), {"parallel.cp=2"});
  EXPECT_EQ(second.start_step, 3);
  ASSERT_EQ(second.losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(first.losses[i], full.losses[i]) << "step " << i + 1;
    EXPECT_EQ(second.losses[i], full.losses[i + 3]) << "step " << i + 4;  // bit for bit
  }
  // Resuming a finished run does nothing more.
  const auto again = train_with(base_yaml(split_dir, 6), {"parallel.cp=2"});
  EXPECT_EQ(again.start_step, 6);
  EXPECT_TRUE(again.losses.empty());
}

// parallel.dp=2 with 2 micro-batches a step, an evaluation and a checkpoint every 3 steps: the losses
// the trainer gave before a DP step read the next step's micro-batches and valid-label count ahead
// (step_prefetch.h), produced by this test at commit ae7b4d1 (cpu preset). A prefetched batch lost,
// repeated or used out of order changes them far beyond the tolerance (which only absorbs other
// compilers' rounding); the resumed run must also match the uninterrupted one bit for bit, so the
// checkpoint's data cursor names the next unconsumed batch.
constexpr double kDataParallelAccumulationGolden[6] = {0x1.5ac4dcp+1, 0x1.452d5ap+1, 0x1.32432cp+1,
                                                       0x1.27b9ep+1,  0x1.2349b8p+1, 0x1.1c1d9cp+1};

TEST(Train, DataParallelAccumulationMatchesItsGoldenLossesAndResumesBitForBit) {
  const std::vector<std::string> dp = {"parallel.dp=2", "run.grad_accum_steps=2", "run.eval_every=3"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), dp.begin(), dp.end());
    return extra;
  };
  const auto full_dir = scratch_dir("dp_full"), split_dir = scratch_dir("dp_split");
  const auto full = train_with(base_yaml(full_dir, 6), with({"run.checkpoint_every=3"}));
  const std::vector<double> golden(std::begin(kDataParallelAccumulationGolden),
                                   std::end(kDataParallelAccumulationGolden));
  expect_same_losses(full.losses, golden, 1e-6, "dp=2, 2 micro-batches");

  const auto first = train_with(base_yaml(split_dir, 3), dp);
  const auto second = train_with(base_yaml(split_dir, 6), dp);
  EXPECT_EQ(second.start_step, 3);
  ASSERT_EQ(first.losses.size(), 3u);
  ASSERT_EQ(second.losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(first.losses[i], full.losses[i]) << "step " << i + 1;
    EXPECT_EQ(second.losses[i], full.losses[i + 3]) << "step " << i + 4;  // bit for bit
  }
}

TEST(Train, CrashWhileWritingACheckpointKeepsThePreviousOne) {
  const auto full_dir = scratch_dir("full"), dir = scratch_dir("crashed");
  const auto full = train_with(base_yaml(full_dir, 6), {"run.checkpoint_every=3"});
  train_with(base_yaml(dir, 3));
  const auto ckpts = dir / "checkpoints";
  const auto step3 = ckpts / "step_00000003";
  ASSERT_TRUE(std::filesystem::exists(step3 / "model.safetensors"));
  // A save of step 6 killed mid-write: its temporary folder holds a truncated file.
  const auto tmp = ckpts / ".tmp-step_00000006";
  std::filesystem::copy(step3, tmp);
  std::filesystem::resize_file(tmp / "model.safetensors", std::filesystem::file_size(tmp / "model.safetensors") / 2);
  // And a newer complete-looking checkpoint whose weights were cut short (a torn copy): it is
  // validated, skipped with a warning, never loaded.
  const auto torn = ckpts / "step_00000006";
  std::filesystem::copy(full_dir / "checkpoints" / "step_00000006", torn);
  std::filesystem::resize_file(torn / "model.safetensors", 100);

  const auto resumed = train_with(base_yaml(dir, 6));
  EXPECT_EQ(resumed.start_step, 3);
  ASSERT_EQ(resumed.losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(resumed.losses[i], full.losses[i + 3]) << "step " << i + 4;
  EXPECT_FALSE(std::filesystem::exists(tmp)) << "the next save removes the leftover temporary folder";
}

TEST(Train, ResumeRefusesCheckpointsOfAnotherConfig) {
  const auto dir = scratch_dir("run");
  train_with(base_yaml(dir, 2));
  testing::write_file(dir / "other.yaml", base_yaml(dir, 4));
  const auto r = run({"train", (dir / "other.yaml").string(), "--set", "model.hidden_size=64"});
  EXPECT_EQ(r.code, kExitError);
  EXPECT_NE(r.err.find("was written with another config: model.hidden_size: 32 in the checkpoint, 64 now"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("run.resume: replace"), std::string::npos) << r.err;
  // resume: replace starts over.
  const auto fresh =
      run({"train", (dir / "other.yaml").string(), "--set", "model.hidden_size=64", "--set", "run.resume=replace"});
  EXPECT_EQ(fresh.code, kExitOk) << fresh.err;
}

TEST(Train, TargetsStopEarlyOrFailTheRun) {
  const auto dir = scratch_dir("run");
  testing::write_file(dir / "t.yaml", base_yaml(dir / "a", 6));
  // An unreachable target: the run ends with exit code 4 and says so.
  auto r = run({"train", (dir / "t.yaml").string(), "--set", "run.target_accuracy=1", "--set", "run.eval_every=3"});
  EXPECT_EQ(r.code, kExitTargetMissed) << r.err;
  EXPECT_NE(r.out.find("target exact match >= 100.0% NOT reached"), std::string::npos) << r.out;
  // A loss target the first evaluation meets stops the run there, with a checkpoint.
  r = run({"train", (dir / "t.yaml").string(), "--set", "run.target_loss=100", "--set", "run.eval_every=3", "--set",
           "run.out_dir=" + (dir / "b").string()});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_NE(r.out.find("done: step 3/6"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("target eval loss <= 100.0000 reached at step 3"), std::string::npos) << r.out;
  EXPECT_TRUE(std::filesystem::exists(dir / "b" / "checkpoints" / "step_00000003"));
}

TEST(TrainSummary, NamesTheRateAndTheMfu) {
  TrainConfig c;
  c.run.steps = 10;
  TrainOutcome r;
  r.final_step = 10;
  r.tokens_seen = 81920;
  r.tokens_per_second = 54500;
  r.mfu = 0.4125;
  r.run_dir = "runs/x";
  const std::string line = summary_line(c, r);
  EXPECT_NE(line.find("| 81.9k tok | 54.5k tok/s | MFU 41.2% | runs/x"), std::string::npos) << line;
  r.mfu_fp8 = 0.20625;  // run.precision: fp8: also against the FP8 peak
  EXPECT_NE(summary_line(c, r).find("| 54.5k tok/s | MFU 41.2% (20.6% of FP8 peak) | runs/x"), std::string::npos)
      << summary_line(c, r);
}

}  // namespace
}  // namespace cpf::trainer
