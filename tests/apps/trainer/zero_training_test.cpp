// parallel.shard through the trainer on CPU thread ranks (framework/distributed/zero_shards.h): dp 2 x
// cp 2 runs with the AdamW moments sharded (optimizer) and with the reduced gradients sharded too
// (gradients) train to the replicated run's losses and weights bit for bit without clipping (the reduced
// gradients and the element-wise updates are the same; only the global norm is summed in another order,
// so with clipping they agree within 1e-6), and checkpoints are logical: a sharded run resumes replicated
// and the reverse, bit for bit, and at another world size within CP's rounding. Stage parameters (ZeRO-3,
// which needs every block recomputed) equals the replicated run with the same recomputation bit for bit.
// Plus the refused options.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include "apps/generate/generate.h"
#include "apps/trainer/trainer.h"
#include "framework/io/checkpoint.h"
#include "framework/io/file_io.h"
#include "framework/io/safetensors.h"
#include "framework/io/sharded_checkpoint.h"
#include "support/test_utils.h"
#include "tests/apps/cli_support.h"

namespace cpf::trainer {
namespace {

using testing::addition_yaml;
using testing::scratch_dir;

TrainOutcome train_with(const std::filesystem::path& dir, int64_t steps, const std::vector<std::string>& overrides) {
  return testing::train_addition(dir, steps, overrides);
}

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

const std::vector<std::string> kDp2Cp2 = {"parallel.dp=2", "parallel.cp=2", "run.checkpoint_every=4"};

// Every parameter's values (flattened) from a checkpoint of either layout: model.safetensors, or the
// pieces of every model.shard-* file put in order (a sharded run's checkpoint, sharded_checkpoint.h).
std::map<std::string, std::vector<double>> checkpoint_weights(const std::string& checkpoint) {
  std::map<std::string, std::vector<double>> out;
  if (!std::filesystem::exists(checkpoint + "/model.safetensors")) {
    std::map<std::string, std::map<int64_t, std::vector<double>>> pieces;
    for (const auto& entry : std::filesystem::directory_iterator(checkpoint)) {
      if (entry.path().filename().string().rfind("model.shard-", 0) != 0) continue;
      for (const auto& [name, t] : io::load_safetensors(entry.path().string())) {
        const auto piece = io::parse_piece_name(name);
        EXPECT_TRUE(piece.has_value()) << name;
        if (piece) pieces[piece->first][piece->second.first] = t.to_vector<double>();
      }
    }
    for (const auto& [name, by_begin] : pieces) {
      for (const auto& [begin, values] : by_begin) {
        EXPECT_EQ(begin, static_cast<int64_t>(out[name].size())) << name;
        out[name].insert(out[name].end(), values.begin(), values.end());
      }
    }
    return out;
  }
  for (const auto& [name, t] : io::load_safetensors(checkpoint + "/model.safetensors"))
    out[name] = t.to_vector<double>();
  return out;
}

void expect_same_weights(const std::string& a, const std::string& b) {
  const auto ta = checkpoint_weights(a), tb = checkpoint_weights(b);
  ASSERT_EQ(ta.size(), tb.size());
  for (const auto& [name, values] : ta) EXPECT_EQ(values, tb.at(name)) << name;
}

void expect_close(const std::vector<double>& a, const std::vector<double>& b, double rtol, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_LE(std::abs(a[i] - b[i]), rtol * std::abs(b[i]))
        << what << " step " << i + 1 << ": " << a[i] << " vs " << b[i];
  }
}

TEST(ZeroTraining, EveryStageEqualsTheReplicatedRun) {
  const TrainOutcome plain = train_with(scratch_dir("replicated"), 20, kDp2Cp2);
  ASSERT_EQ(plain.losses.size(), 20u);
  for (const char* stage : {"optimizer", "gradients"}) {
    const TrainOutcome sharded =
        train_with(scratch_dir(stage), 20, with(kDp2Cp2, {std::string("parallel.shard=") + stage}));
    EXPECT_EQ(sharded.losses, plain.losses) << stage;
    expect_same_weights(sharded.checkpoint, plain.checkpoint);
  }
}

// ZeRO-3: each block's weights gathered for its forward and its recompute, the rest as stage gradients.
TEST(ZeroTraining, ParametersStageEqualsTheReplicatedRun) {
  for (const char* mode : {"full", "selective"}) {
    const std::string recompute = std::string("model.recompute=") + mode;
    const TrainOutcome plain =
        train_with(scratch_dir(std::string("zero3_plain_") + mode), 20, with(kDp2Cp2, {recompute}));
    const TrainOutcome sharded = train_with(scratch_dir(std::string("zero3_") + mode), 20,
                                            with(kDp2Cp2, {recompute, "parallel.shard=parameters"}));
    ASSERT_EQ(sharded.losses.size(), 20u);
    EXPECT_EQ(sharded.losses, plain.losses) << mode;
    expect_same_weights(sharded.checkpoint, plain.checkpoint);
  }
  const std::vector<std::string> clip =
      with(kDp2Cp2, {"run.grad_clip=0.05", "run.grad_accum_steps=2", "model.recompute=full", "run.eval_every=10"});
  const TrainOutcome plain = train_with(scratch_dir("zero3_clip_plain"), 20, clip);
  const TrainOutcome sharded = train_with(scratch_dir("zero3_clip"), 20, with(clip, {"parallel.shard=parameters"}));
  expect_close(sharded.losses, plain.losses, 1e-6, "parameters with clipping and accumulation");
  ASSERT_TRUE(sharded.last_eval.has_value() && plain.last_eval.has_value());
  EXPECT_EQ(sharded.last_eval->accuracy, plain.last_eval->accuracy);
}

TEST(ZeroTraining, WithClippingWithinOneInAMillion) {
  const std::vector<std::string> clip = with(kDp2Cp2, {"run.grad_clip=0.05", "run.grad_accum_steps=2"});
  const TrainOutcome plain = train_with(scratch_dir("clip_replicated"), 20, clip);
  for (const char* stage : {"optimizer", "gradients"}) {
    const TrainOutcome sharded =
        train_with(scratch_dir(std::string("clip_") + stage), 20, with(clip, {std::string("parallel.shard=") + stage}));
    expect_close(sharded.losses, plain.losses, 1e-6, stage);
  }
}

// Save with one stage, resume with another: the checkpoint holds the whole state, so the resumed steps
// equal the uninterrupted run's.
TEST(ZeroTraining, CheckpointsResumeAcrossStages) {
  const TrainOutcome full = train_with(scratch_dir("full"), 8, kDp2Cp2);
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {"gradients", "none"}, {"none", "optimizer"}, {"parameters", "none"}, {"optimizer", "parameters"}};
  for (const auto& [first_stage, second_stage] : pairs) {
    const auto dir = scratch_dir("split_" + first_stage);
    // Recomputation (which ZeRO-3 needs) changes no value, so both halves may use it.
    const TrainOutcome first =
        train_with(dir, 4, with(kDp2Cp2, {"parallel.shard=" + first_stage, "model.recompute=full"}));
    const TrainOutcome second =
        train_with(dir, 8, with(kDp2Cp2, {"parallel.shard=" + second_stage, "model.recompute=selective"}));
    ASSERT_EQ(second.start_step, 4) << first_stage;
    ASSERT_EQ(second.losses.size(), 4u);
    for (size_t i = 0; i < 4; ++i) EXPECT_EQ(second.losses[i], full.losses[i + 4]) << first_stage << " step " << i + 5;
    expect_same_weights(second.checkpoint, full.checkpoint);
  }
}

// A sharded run's checkpoint is written by every rank in parallel: one model and one optimizer file a rank
// (each about a quarter of the elements), nothing gathered; generate reads it, and resume skips one whose
// shard is damaged (resuming from the one before).
TEST(ZeroTraining, ShardedRunsWriteTheirCheckpointsInParallel) {
  const auto dir = scratch_dir("parallel_write");
  const TrainOutcome run = train_with(dir, 8, with(kDp2Cp2, {"parallel.shard=gradients"}));
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(run.checkpoint)) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  std::vector<std::string> expected{"meta.json"};
  for (const char* role : {"model", "optimizer"}) {
    for (int r = 0; r < 4; ++r) expected.push_back(io::shard_file_name(role, r, 4));
  }
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(names, expected);
  const auto size = [&](int r) {
    return static_cast<double>(std::filesystem::file_size(run.checkpoint + "/" + io::shard_file_name("model", r, 4)));
  };
  for (int r = 1; r < 4; ++r) EXPECT_NEAR(size(r) / size(0), 1.0, 0.25) << "rank " << r;

  GenerateOptions o;
  o.checkpoint = run.checkpoint;
  o.max_new_tokens = 3;
  EXPECT_FALSE(generate(o).completion.empty());

  const std::string shard = run.checkpoint + "/" + io::shard_file_name("model", 3, 4);
  std::string bytes = io::read_file(shard);
  bytes[bytes.size() - 3] = static_cast<char>(bytes[bytes.size() - 3] ^ 0x10);
  io::write_file(shard, bytes, false);
  const TrainOutcome resumed = train_with(dir, 10, with(kDp2Cp2, {"parallel.shard=optimizer"}));
  EXPECT_EQ(resumed.start_step, 4) << "the damaged step-8 checkpoint is skipped";
}

// 4 ranks sharded -> 2 ranks replicated (cp 2 -> 1, the same data-parallel batches): the state carries
// over whole; the losses differ from the 2-rank run only by context parallelism's rounding.
TEST(ZeroTraining, CheckpointsResumeAtAnotherWorldSize) {
  const std::vector<std::string> dp2 = {"parallel.dp=2", "run.checkpoint_every=4"};
  const TrainOutcome full = train_with(scratch_dir("dp2_full"), 8, dp2);
  const auto dir = scratch_dir("resharded");
  train_with(dir, 4, with(kDp2Cp2, {"parallel.shard=parameters", "model.recompute=full"}));
  const TrainOutcome second = train_with(dir, 8, with(dp2, {"parallel.shard=none"}));
  ASSERT_EQ(second.start_step, 4);
  expect_close(second.losses, std::vector<double>(full.losses.begin() + 4, full.losses.end()), 1e-5, "4 -> 2 ranks");
  // And back: 2 ranks replicated -> 4 ranks sharded.
  const auto back = scratch_dir("resharded_back");
  train_with(back, 4, dp2);
  const TrainOutcome grown = train_with(back, 8, with(kDp2Cp2, {"parallel.shard=parameters", "model.recompute=full"}));
  ASSERT_EQ(grown.start_step, 4);
  expect_close(grown.losses, std::vector<double>(full.losses.begin() + 4, full.losses.end()), 1e-5, "2 -> 4 ranks");
}

// model.recompute composes with sharding and CP through the trainer: bit for bit the plain run, and a run
// resumes with another recompute mode (recomputation is not part of what a checkpoint means).
TEST(ZeroTraining, RecomputeComposesWithShardingAndResumes) {
  const TrainOutcome plain = train_with(scratch_dir("recompute_plain"), 8, kDp2Cp2);
  for (const char* mode : {"full", "selective"}) {
    const TrainOutcome r =
        train_with(scratch_dir(std::string("recompute_") + mode), 8,
                   with(kDp2Cp2, {std::string("model.recompute=") + mode, "parallel.shard=gradients"}));
    EXPECT_EQ(r.losses, plain.losses) << mode;
  }
  const auto dir = scratch_dir("recompute_resume");
  train_with(dir, 4, with(kDp2Cp2, {"model.recompute=full"}));
  const TrainOutcome second = train_with(dir, 8, kDp2Cp2);
  ASSERT_EQ(second.start_step, 4);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(second.losses[i], plain.losses[i + 4]) << "step " << i + 5;
}

TEST(ZeroTraining, RefusedOptions) {
  const auto dir = scratch_dir("refused");
  EXPECT_CPF_ERROR(train_with(dir, 2, with(kDp2Cp2, {"parallel.shard=parameters"})),
                   "parameters (ZeRO-3) gathers each block's weights for its forward and again for its recompute in "
                   "the backward, so every block must be recomputed: set model.recompute: full or selective with "
                   "model.recompute_layers: 0 (now none for 0 of 2 blocks)");
  EXPECT_CPF_ERROR(
      train_with(dir, 2,
                 with(kDp2Cp2, {"parallel.shard=parameters", "model.recompute=full", "model.recompute_layers=1"})),
      "(now on for 1 of 2 blocks), or use parallel.shard: gradients");
  EXPECT_CPF_ERROR(train_with(dir, 2, {"parallel.shard=optimizer"}),
                   "shards the training state over the dp x cp ranks, but this run has one rank (parallel.dp=1, "
                   "parallel.cp=1)");
}

}  // namespace
}  // namespace cpf::trainer
