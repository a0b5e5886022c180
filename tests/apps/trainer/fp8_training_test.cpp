// run.precision: fp8 with fp8.recipe: delayed through the whole trainer on the CPU (the CPU's FP8 ops are
// the reference the CUDA ones are tested against): the curve tracks bf16 yet is not current scaling's,
// resume carries the scaling state and reproduces the uninterrupted run bit for bit, data- and
// context-parallel ranks train with their amaxes reduced, and the fp8 section's bad values are refused with the fix.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "apps/run/checkpointing.h"
#include "apps/trainer/step/training_step.h"
#include "apps/trainer/trainer.h"
#include "framework/distributed/launcher.h"
#include "framework/io/checkpoint.h"
#include "support/test_utils.h"
#include "tests/apps/cli_support.h"

namespace cpf::trainer {
namespace {

using testing::addition_yaml;
using testing::scratch_dir;

TrainOutcome train_with(const std::filesystem::path& dir, int64_t steps, const std::vector<std::string>& overrides) {
  return testing::train_addition(dir, steps, overrides);
}

const std::vector<std::string> kDelayed = {"run.precision=fp8", "fp8.recipe=delayed"};

std::vector<std::string> with(std::vector<std::string> base, const std::vector<std::string>& more) {
  base.insert(base.end(), more.begin(), more.end());
  return base;
}

// Delayed scaling casts each step with the scales of earlier steps: the first step equals current
// scaling's (a new slot casts by its own amax), later steps differ, and the curve stays within the 5% of
// bf16 that current scaling keeps (Precision.Fp8LossCurveTracksBf16AndLearns).
TEST(Fp8Training, DelayedScalingTracksBf16AndLearns) {
  const auto bf16 = train_with(scratch_dir("bf16"), 20, {"run.precision=bf16"});
  const auto current = train_with(scratch_dir("current"), 20, {"run.precision=fp8"});
  const auto delayed = train_with(scratch_dir("delayed"), 20, kDelayed);
  ASSERT_EQ(delayed.losses.size(), 20u);
  EXPECT_EQ(delayed.losses[0], current.losses[0]);
  bool differs = false;
  for (size_t i = 0; i < 20; ++i) {
    EXPECT_LE(std::abs(delayed.losses[i] - bf16.losses[i]), 0.05 * bf16.losses[i])
        << "step " << i + 1 << ": delayed " << delayed.losses[i] << " vs bf16 " << bf16.losses[i];
    differs = differs || delayed.losses[i] != current.losses[i];
  }
  EXPECT_TRUE(differs) << "delayed scaling reproduced current scaling bit for bit: no slot's scale was used";
  EXPECT_LT(delayed.losses.back(), 0.85 * delayed.losses.front());
}

// The checkpoint carries every scale and amax history (meta.json's extra.fp8_scaling); a resumed run
// casts with them, so steps 4-6 equal the uninterrupted run's (fresh slots would cast by their own amax).
TEST(Fp8Training, DelayedResumeReproducesTheUninterruptedRunBitForBit) {
  const auto full_dir = scratch_dir("full"), split_dir = scratch_dir("split");
  const auto full = train_with(full_dir, 6, with(kDelayed, {"run.checkpoint_every=3"}));
  const auto first = train_with(split_dir, 3, kDelayed);
  ASSERT_FALSE(first.checkpoint.empty());
  const io::CheckpointMeta meta = io::read_checkpoint_meta(first.checkpoint);
  ASSERT_TRUE(meta.extra.contains("fp8_scaling"));
  EXPECT_NE(meta.extra.at("fp8_scaling").find("\nblocks.0.fp8_0 "), std::string::npos) << meta.extra.at("fp8_scaling");
  const auto second = train_with(split_dir, 6, kDelayed);
  EXPECT_EQ(second.start_step, 3);
  ASSERT_EQ(second.losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(first.losses[i], full.losses[i]) << "step " << i + 1;
    EXPECT_EQ(second.losses[i], full.losses[i + 3]) << "step " << i + 4;
  }
  // Current scaling keeps no state: its checkpoints carry none.
  const auto current = train_with(scratch_dir("current"), 2, {"run.precision=fp8"});
  EXPECT_FALSE(io::read_checkpoint_meta(current.checkpoint).extra.contains("fp8_scaling"));
}

// fp8.cache_weights (the default) casts each weight once a step for the step's forwards, recomputes and
// micro-batches (framework/autograd/fp8_weight_cache.h): the losses equal those of casting at every call
// bit for bit, with either recipe.
TEST(Fp8Training, WeightCopiesKeptForTheStepChangeNoLoss) {
  for (const std::vector<std::string>& recipe : {std::vector<std::string>{"run.precision=fp8"}, kDelayed}) {
    const std::vector<std::string> shape = with(recipe, {"model.recompute=full", "run.grad_accum_steps=2"});
    const auto kept = train_with(scratch_dir("kept"), 6, shape);
    const auto per_call = train_with(scratch_dir("per_call"), 6, with(shape, {"fp8.cache_weights=false"}));
    ASSERT_EQ(kept.losses.size(), 6u);
    ASSERT_EQ(per_call.losses.size(), 6u);
    for (size_t i = 0; i < 6; ++i) EXPECT_EQ(kept.losses[i], per_call.losses[i]) << recipe.back() << " step " << i + 1;
  }
}

// fp8.fuse_activation_casts: the MLP's activation writing its output's FP8 codes (fp8_linear_after) trains
// exactly as the activation then the cast, with GELU and with SwiGLU, under both recipes (the CPU computes
// the same composition; tests/tensor/cuda/fp8_activation_test.cpp holds the GPU's fused kernels to it).
TEST(Fp8Training, ActivationCastsFusedOrNotTrainTheSame) {
  for (const char* mlp : {"model.mlp=gelu", "model.mlp=swiglu"}) {
    for (const std::vector<std::string>& recipe : {std::vector<std::string>{"run.precision=fp8"}, kDelayed}) {
      const std::vector<std::string> shape = with(recipe, {mlp});
      const auto fused = train_with(scratch_dir("fused"), 4, with(shape, {"fp8.fuse_activation_casts=true"}));
      const auto unfused = train_with(scratch_dir("unfused"), 4, with(shape, {"fp8.fuse_activation_casts=false"}));
      ASSERT_EQ(fused.losses.size(), 4u);
      EXPECT_EQ(fused.losses, unfused.losses) << mlp << " " << recipe.back();
    }
  }
}

// Two data-parallel thread ranks see different tokens, so their amaxes differ; the trainer reduces them
// (max) before each update, and the run trains as one rank's does.
TEST(Fp8Training, DataParallelDelayedScalingTracksBf16) {
  const auto bf16 = train_with(scratch_dir("dp_bf16"), 12, {"run.precision=bf16", "parallel.dp=2"});
  const auto delayed = train_with(scratch_dir("dp_delayed"), 12, with(kDelayed, {"parallel.dp=2"}));
  ASSERT_EQ(delayed.losses.size(), 12u);
  for (size_t i = 0; i < 12; ++i) {
    EXPECT_LE(std::abs(delayed.losses[i] - bf16.losses[i]), 0.05 * bf16.losses[i]) << "step " << i + 1;
  }
  EXPECT_TRUE(io::read_checkpoint_meta(delayed.checkpoint).extra.contains("fp8_scaling"));
}

// Context parallelism splits each sequence over two ranks: each casts its own half of the activations, the
// amaxes are reduced over both, and the curve tracks bf16 at cp=2 (current and delayed scaling).
TEST(Fp8Training, ContextParallelFp8TracksBf16) {
  const auto bf16 = train_with(scratch_dir("cp_bf16"), 12, {"run.precision=bf16", "parallel.cp=2"});
  const auto current = train_with(scratch_dir("cp_current"), 12, {"run.precision=fp8", "parallel.cp=2"});
  const auto delayed = train_with(scratch_dir("cp_delayed"), 12, with(kDelayed, {"parallel.cp=2"}));
  ASSERT_EQ(current.losses.size(), 12u);
  ASSERT_EQ(delayed.losses.size(), 12u);
  for (size_t i = 0; i < 12; ++i) {
    EXPECT_LE(std::abs(current.losses[i] - bf16.losses[i]), 0.05 * bf16.losses[i]) << "current, step " << i + 1;
    EXPECT_LE(std::abs(delayed.losses[i] - bf16.losses[i]), 0.05 * bf16.losses[i]) << "delayed, step " << i + 1;
  }
  EXPECT_NE(current.losses.back(), bf16.losses.back());  // the linears ran in FP8
}

// Ranks that made other FP8 call sites (or the same in another order) would reduce unrelated amaxes:
// refused on every rank, naming the slot counts; the same sites pass and are not checked again.
TEST(Fp8Training, RanksWithOtherFp8CallSitesAreRefused) {
  for (const bool reordered : {false, true}) {
    std::vector<std::string> errors(2);
    dist::launch(2, [&](dist::RankContext& ctx) {
      Fp8ScalingState state({.recipe = Fp8Recipe::delayed}, Device::cpu());
      const std::vector<std::string> keys = ctx.rank == 1 && reordered
                                                ? std::vector<std::string>{"blocks.0.fp8_1", "blocks.0.fp8_0"}
                                                : std::vector<std::string>{"blocks.0.fp8_0", "blocks.0.fp8_1"};
      for (const std::string& k : keys) state.slot(k);
      if (ctx.rank == 1 && !reordered) state.slot("blocks.0.fp8_2");
      try {
        check_same_fp8_sites(*ctx.world, state, Device::cpu());
      } catch (const Error& e) {
        errors[ctx.rank] = e.what();
      }
    });
    for (const std::string& e : errors) {
      EXPECT_NE(e.find("fp8: the ranks made different FP8 call sites ("), std::string::npos) << e;
      EXPECT_NE(e.find(reordered ? "2 to 2 slots, or in another order" : "2 to 3 slots"), std::string::npos) << e;
    }
  }
  dist::launch(2, [&](dist::RankContext& ctx) {
    Fp8ScalingState state({.recipe = Fp8Recipe::delayed}, Device::cpu());
    state.slot("a");
    check_same_fp8_sites(*ctx.world, state, Device::cpu());
    EXPECT_EQ(state.agreed_slots(), 1);
  });
}

std::string config_error(const std::vector<std::string>& overrides) {
  try {
    load_train_config_string(addition_yaml(std::filesystem::temp_directory_path(), 1), "t.yaml", overrides);
  } catch (const config::ConfigError& e) {
    return e.what();
  }
  return "";
}

// The window's clipped casts reach metrics.jsonl under delayed scaling: with a history of one step every
// growth of an amax clips, with 8 bits of margin (256x headroom) none does; current scaling has no count.
TEST(Fp8Training, DelayedScalingLogsTheCastsThatClipped) {
  const auto clipped_per_line = [](const std::filesystem::path& dir) {
    std::vector<int64_t> counts;
    std::istringstream in(testing::read_file(dir / "metrics.jsonl"));
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j.contains("loss")) counts.push_back(j.contains("fp8_clipped") ? j["fp8_clipped"].get<int64_t>() : -1);
    }
    return counts;
  };
  const auto sum = [](const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); };
  const auto eager = scratch_dir("eager");
  train_with(eager, 12, with(kDelayed, {"fp8.amax_history=1", "fp8.amax_compute=most_recent"}));
  const std::vector<int64_t> counts = clipped_per_line(eager);
  ASSERT_EQ(counts.size(), 12u);
  EXPECT_EQ(counts[0], 0) << "step 1 casts with current scaling";
  EXPECT_GT(sum(counts), 0);
  const auto headroom = scratch_dir("headroom");
  train_with(headroom, 12, with(kDelayed, {"fp8.margin=8"}));
  EXPECT_EQ(clipped_per_line(headroom), std::vector<int64_t>(12, 0));
  const auto current = scratch_dir("current");
  train_with(current, 3, {"run.precision=fp8"});
  EXPECT_EQ(clipped_per_line(current), std::vector<int64_t>(3, -1));
}

// The run's banner and check-config say what computes in FP8 and with which recipe.
TEST(Fp8Training, TheBannerNamesTheRecipe) {
  const auto describe = [](const std::vector<std::string>& overrides) {
    return precision_description(
        load_train_config_string(addition_yaml(std::filesystem::temp_directory_path(), 1), "t.yaml", overrides));
  };
  EXPECT_EQ(describe({}), "fp32");
  EXPECT_EQ(describe({"run.precision=bf16"}), "bf16 (f32 master weights)");
  EXPECT_EQ(describe({"run.precision=fp8"}), "fp8 linears (current scaling; margin 0), bf16 (f32 master weights)");
  EXPECT_EQ(describe(with(kDelayed, {"fp8.amax_history=1024", "fp8.amax_compute=most_recent", "fp8.margin=2"})),
            "fp8 linears (delayed scaling: amax history 1024, most recent; margin 2), bf16 (f32 master weights)");
  std::ostringstream out;
  const TrainConfig c = load_train_config_string(addition_yaml(scratch_dir("banner"), 1), "t.yaml", kDelayed);
  train(c, out);
  EXPECT_NE(out.str().find("| cpu fp8 linears (delayed scaling: amax history 16, max; margin 0), bf16"),
            std::string::npos)
      << out.str();
}

TEST(Fp8Training, RefusesFp8OptionsThatMeanNothingOrAreOutOfRange) {
  EXPECT_NE(config_error({"fp8.recipe=delayed"})
                .find("delayed scales FP8 GEMMs, but run.precision is not fp8; set "
                      "run.precision: fp8"),
            std::string::npos)
      << config_error({"fp8.recipe=delayed"});
  EXPECT_NE(config_error({"run.precision=fp8", "fp8.recipe=late"}).find("is not one of: current, delayed"),
            std::string::npos)
      << config_error({"run.precision=fp8", "fp8.recipe=late"});
  EXPECT_NE(config_error({"run.precision=fp8", "fp8.amax_history=0"}).find("fp8.amax_history"), std::string::npos)
      << config_error({"run.precision=fp8", "fp8.amax_history=0"});
  EXPECT_EQ(config_error(with(kDelayed, {"fp8.amax_history=1024", "fp8.amax_compute=most_recent", "fp8.margin=1"})),
            "");
  // The bf16 blocks: only under fp8, and at least one block left in FP8 (the addition model has 2).
  EXPECT_NE(config_error({"run.precision=bf16", "fp8.bf16_last_blocks=1"})
                .find("fp8.bf16_last_blocks=1 keeps blocks out of FP8, but run.precision is not fp8 (every block is "
                      "already bf16); set run.precision: fp8 or drop the key"),
            std::string::npos)
      << config_error({"run.precision=bf16", "fp8.bf16_last_blocks=1"});
  EXPECT_NE(config_error({"run.precision=fp8", "fp8.bf16_first_blocks=1", "fp8.bf16_last_blocks=1"})
                .find("fp8.bf16_first_blocks=1 and fp8.bf16_last_blocks=1 leave none of the 2 blocks in FP8; lower "
                      "them (at most 1 together) or use run.precision: bf16"),
            std::string::npos)
      << config_error({"run.precision=fp8", "fp8.bf16_first_blocks=1", "fp8.bf16_last_blocks=1"});
  EXPECT_NE(config_error({"run.precision=fp8", "fp8.bf16_first_blocks=-1"}).find("fp8.bf16_first_blocks"),
            std::string::npos);
  EXPECT_EQ(config_error({"run.precision=fp8", "fp8.bf16_first_blocks=1"}), "");
  EXPECT_NE(config_error({"run.precision=bf16", "fp8.fast_forward_accumulation=true"})
                .find("fp8.fast_forward_accumulation=true sets how FP8 GEMMs accumulate, but run.precision is not fp8; "
                      "set run.precision: fp8 (or drop the key)"),
            std::string::npos)
      << config_error({"run.precision=bf16", "fp8.fast_forward_accumulation=true"});
  EXPECT_EQ(config_error({"run.precision=fp8", "fp8.fast_forward_accumulation=true"}), "");
  EXPECT_NE(config_error({"run.precision=bf16", "fp8.fuse_activation_casts=false"})
                .find("fp8.fuse_activation_casts=false sets how the activations feed FP8 GEMMs, but run.precision is "
                      "not fp8; set run.precision: fp8 (or drop the key)"),
            std::string::npos)
      << config_error({"run.precision=bf16", "fp8.fuse_activation_casts=false"});
  EXPECT_EQ(config_error({"run.precision=bf16", "fp8.fuse_activation_casts=true"}), "") << "the default";
}

// fp8.bf16_first_blocks: the first block's linears stay bf16, so the curve is neither the all-FP8 one nor
// bf16's, and it still learns; the banner says which blocks.
TEST(Fp8Training, BlocksKeptInBf16TrainBetweenFp8AndBf16) {
  const auto bf16 = train_with(scratch_dir("bf16_edges"), 12, {"run.precision=bf16"});
  const auto fp8 = train_with(scratch_dir("fp8_edges"), 12, {"run.precision=fp8"});
  const auto edges = train_with(scratch_dir("edges"), 12, {"run.precision=fp8", "fp8.bf16_first_blocks=1"});
  ASSERT_EQ(edges.losses.size(), 12u);
  EXPECT_NE(edges.losses, fp8.losses);
  EXPECT_NE(edges.losses, bf16.losses);
  EXPECT_LT(edges.losses.back(), 0.9 * edges.losses.front());
  EXPECT_EQ(precision_description(load_train_config_string(addition_yaml(scratch_dir("edges_banner"), 1), "t.yaml",
                                                           {"run.precision=fp8", "fp8.bf16_last_blocks=1"})),
            "fp8 linears (current scaling; margin 0; bf16 blocks: first 0, last 1), bf16 (f32 master weights)");
  EXPECT_EQ(
      precision_description(load_train_config_string(addition_yaml(scratch_dir("fast_banner"), 1), "t.yaml",
                                                     {"run.precision=fp8", "fp8.fast_forward_accumulation=true"})),
      "fp8 linears (current scaling; margin 0; fast forward accumulation), bf16 (f32 master weights)");
  EXPECT_EQ(precision_description(load_train_config_string(addition_yaml(scratch_dir("unfused_banner"), 1), "t.yaml",
                                                           {"run.precision=fp8", "fp8.fuse_activation_casts=false"})),
            "fp8 linears (current scaling; margin 0; activation casts not fused), bf16 (f32 master weights)");
}

}  // namespace
}  // namespace cpf::trainer
