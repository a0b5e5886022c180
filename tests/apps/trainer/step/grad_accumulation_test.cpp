// Gradient accumulation (apps/trainer/step/grad_accumulation.h): micro-batches accumulated over one step give
// the loss and gradients of one batch holding all of them, on one rank, under DP and under CP (thread
// ranks); the config keys that set it, and every rejected combination with its message.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>

#include "apps/trainer/step/grad_accumulation.h"
#include "apps/trainer/trainer.h"
#include "framework/autograd/ops.h"
#include "framework/distributed/device_mesh.h"
#include "framework/distributed/launcher.h"
#include "tests/apps/addition_batches.h"
#include "tests/apps/cli_support.h"
#include "tests/support/test_utils.h"

#define EXPECT_CONFIG_ERROR(statement, substring)                                                           \
  do {                                                                                                      \
    try {                                                                                                   \
      statement;                                                                                            \
      ADD_FAILURE() << "expected config::ConfigError containing '" << (substring) << "' from: " #statement; \
    } catch (const config::ConfigError& e) {                                                                \
      EXPECT_NE(std::string(e.what()).find(substring), std::string::npos) << "message was: " << e.what();   \
    }                                                                                                       \
  } while (0)

namespace cpf::trainer {
namespace {

models::data::DataOptions batch_options() { return cpf::testing::addition_batches(); }

// The batches of `parts` as one THD batch: their sequences back to back (what a loader with a budget
// of all their tokens would give, had the packing cut them the same way).
models::data::Batch concatenate(const std::vector<models::data::Batch>& parts) {
  models::data::Batch all;
  all.pad_multiple = parts.front().pad_multiple;
  all.cu_seqlens = {0};
  all.cu_seqlens_padded = {0};
  std::vector<Tensor> tokens, labels, positions;
  for (const models::data::Batch& b : parts) {
    const int64_t real = all.cu_seqlens.back(), stored = all.cu_seqlens_padded.back();
    for (size_t i = 1; i < b.cu_seqlens.size(); ++i) all.cu_seqlens.push_back(real + b.cu_seqlens[i]);
    for (size_t i = 1; i < b.cu_seqlens_padded.size(); ++i)
      all.cu_seqlens_padded.push_back(stored + b.cu_seqlens_padded[i]);
    all.documents.insert(all.documents.end(), b.documents.begin(), b.documents.end());
    all.num_valid_labels += b.num_valid_labels;
    tokens.push_back(b.tokens);
    labels.push_back(b.labels);
    positions.push_back(b.positions);
  }
  all.tokens = cat(tokens, 0);
  all.labels = cat(labels, 0);
  all.positions = cat(positions, 0);
  return all;
}

struct StepResult {
  double loss = 0;
  int64_t valid = 0;
  std::map<std::string, std::vector<double>> grads;
};

// One step on `dp` x `cp` thread ranks of an f64 model: rank (d, c) accumulates DP rank d's
// `micro` batches (from the loader of that DP rank), or their concatenation when `as_one_batch`.
StepResult run_step(int dp, int cp, int micro, bool as_one_batch) {
  StepResult result;
  std::mutex mu;
  dist::launch(dp * cp, [&](dist::RankContext& ctx) {
    dist::DeviceMesh mesh(ctx.world, dist::MeshShape{.dp = dp, .cp = cp});
    RankGroups g;
    g.world = ctx.world;
    g.dp_rank = mesh.coord().dp;
    g.dp_size = dp;
    g.cp_rank = mesh.coord().cp;
    g.cp_size = cp;
    if (cp > 1) g.cp = cp::ContextParallel{cp::CommType::p2p, mesh.cp(), nullptr, nullptr};
    Generator gen(11);
    const models::GPT model(
        models::GPTOptions{.vocab_size = 14, .hidden_size = 16, .num_layers = 2, .num_heads = 2, .dtype = DType::f64},
        &gen);
    std::vector<Tensor> params;
    for (const auto& [name, t] : model.named_parameters()) params.push_back(t);
    std::unique_ptr<dist::GradientReducer> reducer;
    if (dp * cp > 1)
      reducer = std::make_unique<dist::GradientReducer>(params, ctx.world,
                                                        dist::GradientReducerOptions{.op = dist::ReduceOp::sum});
    models::data::DataLoader loader(batch_options(), g.dp_rank, dp);
    std::vector<models::data::Batch> batches;
    for (int i = 0; i < micro; ++i) batches.push_back(loader.next());
    if (as_one_batch) batches = {concatenate(batches)};
    const AccumulatedLoss loss = accumulate_gradients(model, batches, g, reducer.get());
    if (ctx.rank != 0) return;
    std::lock_guard lock(mu);
    result.loss = loss.loss;
    result.valid = loss.valid_labels;
    for (const auto& [name, t] : model.named_parameters()) result.grads[name] = t.grad().to_vector<double>();
  });
  return result;
}

void expect_same_step(const StepResult& accumulated, const StepResult& one_batch) {
  EXPECT_EQ(accumulated.valid, one_batch.valid);
  EXPECT_NEAR(accumulated.loss, one_batch.loss, 1e-12 * std::abs(one_batch.loss));
  ASSERT_EQ(accumulated.grads.size(), one_batch.grads.size());
  double largest = 0;
  for (const auto& [name, g] : one_batch.grads) {
    const std::vector<double>& a = accumulated.grads.at(name);
    ASSERT_EQ(a.size(), g.size()) << name;
    for (size_t i = 0; i < g.size(); ++i) {
      EXPECT_NEAR(a[i], g[i], 1e-12) << name << "[" << i << "]";
      largest = std::max(largest, std::abs(g[i]));
    }
  }
  EXPECT_GT(largest, 1e-4);  // real gradients, not zeros compared with zeros
}

TEST(GradAccumulation, EqualsOneBatchOnOneRank) {
  const StepResult accumulated = run_step(1, 1, 3, false), one = run_step(1, 1, 3, true);
  expect_same_step(accumulated, one);
  // The micro-batches differ from one another: three of them are not one of them three times.
  const StepResult first = run_step(1, 1, 1, false);
  EXPECT_GT(std::abs(first.loss - one.loss), 1e-6);
}

TEST(GradAccumulation, EqualsOneBatchUnderDataParallel) {
  expect_same_step(run_step(2, 1, 2, false), run_step(2, 1, 2, true));
}

TEST(GradAccumulation, EqualsOneBatchUnderContextParallel) {
  expect_same_step(run_step(1, 2, 2, false), run_step(1, 2, 2, true));
}

TEST(GradAccumulation, EqualsOneBatchUnderDataAndContextParallel) {
  expect_same_step(run_step(2, 2, 2, false), run_step(2, 2, 2, true));
}

// ---- config ----------------------------------------------------------------------------------

std::string config_yaml(const std::string& extra_data, const std::string& extra_run = "") {
  return "run:\n  steps: 2\n  threads: 1\n" + extra_run +
         "model:\n  hidden_size: 16\n  num_layers: 1\n  num_heads: 2\n"
         "data:\n  seq_len: 16\n  batch_size: 4\n" +
         extra_data + "parallel:\n  dp: 2\n";
}

TEST(GradAccumulation, TotalBatchTokensSetsTheMicroSteps) {
  // 4 x 16 tokens per batch x dp 2 = 128 tokens per micro-step.
  const TrainConfig c = load_train_config_string(config_yaml("  total_batch_tokens: 512\n"), "t.yaml");
  EXPECT_EQ(micro_step_tokens(c), 128);
  EXPECT_EQ(grad_accum_steps(c), 4);
  const TrainConfig d = load_train_config_string(config_yaml("", "  grad_accum_steps: 3\n"), "t.yaml");
  EXPECT_EQ(grad_accum_steps(d), 3);
  // Both set and agreeing is accepted.
  EXPECT_EQ(grad_accum_steps(load_train_config_string(
                config_yaml("  total_batch_tokens: 512\n", "  grad_accum_steps: 4\n"), "t.yaml")),
            4);
}

TEST(GradAccumulation, RejectsATotalThatIsNotAMultipleOfAMicroStep) {
  EXPECT_CONFIG_ERROR(load_train_config_string(config_yaml("  total_batch_tokens: 500\n"), "t.yaml"),
                      "t.yaml:11:23: data.total_batch_tokens=500 must be a multiple of the tokens of one micro-step "
                      "(64 tokens per batch x parallel.dp=2 = 128); use 384");
  EXPECT_CONFIG_ERROR(load_train_config_string(config_yaml("  total_batch_tokens: 100\n"), "t.yaml"), "use 128");
}

TEST(GradAccumulation, RejectsDisagreeingKeys) {
  EXPECT_CONFIG_ERROR(
      load_train_config_string(config_yaml("  total_batch_tokens: 512\n", "  grad_accum_steps: 2\n"), "t.yaml"),
      "t.yaml:4:21: run.grad_accum_steps=2 disagrees with data.total_batch_tokens=512 (64 tokens per batch x "
      "parallel.dp=2 = 128 per micro-step gives 4 micro-steps); set only one of the two");
  EXPECT_CONFIG_ERROR(load_train_config_string(config_yaml("", "  grad_accum_steps: 0\n"), "t.yaml"),
                      "run.grad_accum_steps=0");
}

TEST(GradAccumulation, CheckConfigReportsTheStep) {
  const auto dir = testing::scratch_dir("cfg");
  testing::write_file(dir / "c.yaml", config_yaml("  total_batch_tokens: 512\n"));
  const testing::CliResult r = testing::run({"check-config", (dir / "c.yaml").string()});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("  batch: 512 tokens per step = 4 accumulated micro-batches x 64 tokens x dp 2\n"),
            std::string::npos)
      << r.out;
  testing::write_file(dir / "bad.yaml", config_yaml("  total_batch_tokens: 500\n"));
  const testing::CliResult bad = testing::run({"check-config", (dir / "bad.yaml").string()});
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("data.total_batch_tokens=500 must be a multiple of the tokens of one micro-step"),
            std::string::npos)
      << bad.err;
}

// The trainer runs the micro-steps: the tokens of a step (metrics) are grad_accum_steps batches.
TEST(GradAccumulation, TrainerStepsCountEveryMicroBatch) {
  const auto dir = testing::scratch_dir("run");
  const std::string yaml = "run:\n  out_dir: " + dir.string() +
                           "\n  steps: 2\n  log_every: 1\n  eval_every: 0\n  eval_batches: 1\n  eval_examples: 4\n"
                           "  threads: 1\n  grad_accum_steps: 3\n"
                           "model:\n  hidden_size: 16\n  num_layers: 1\n  num_heads: 2\n"
                           "data:\n  seq_len: 16\n  tokens_per_batch: 64\n";
  std::ostringstream out;
  const TrainOutcome outcome = train(load_train_config_string(yaml, "t.yaml"), out);
  ASSERT_EQ(outcome.losses.size(), 2u);
  EXPECT_TRUE(std::isfinite(outcome.losses[0]));
  EXPECT_NE(out.str().find("gradient accumulation: 3 micro-batches per step (192 tokens per step over 1 DP rank(s))"),
            std::string::npos)
      << out.str();
}

}  // namespace
}  // namespace cpf::trainer
