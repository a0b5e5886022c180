// model.recompute (activation recomputation of the GPT blocks, framework/autograd/checkpoint.h): losses
// and every parameter gradient equal the model without recomputation bit for bit in f64, for each
// attention type and MLP, `full` and `selective`, the first N blocks only, gradient accumulation, and
// under context parallelism on thread ranks for every strategy (the recompute re-runs the ring under
// `full`; `selective` keeps the attention's result and runs no message again). With sharded parameters
// (set_parameter_units) the model acquires and releases its units in the order ZeRO-3 needs. Plus the
// option checks.
#include <gtest/gtest.h>

#include <map>
#include <mutex>

#include "framework/autograd/ops.h"
#include "framework/distributed/device_mesh.h"
#include "framework/distributed/launcher.h"
#include "models/data/cp_shard.h"
#include "models/data/data_loader.h"
#include "models/gpt.h"
#include "models/gpt_input.h"
#include "models/gpt_test_options.h"
#include "support/test_utils.h"

namespace cpf::models {
namespace {

using testing::all_close;

GPTOptions options(AttentionType attention, nn::Activation mlp) {
  GPTOptions o = small_f64_gpt(attention);
  o.num_layers = 3;
  o.mlp = mlp;
  o.init_std = 0.1;
  return o;
}

std::vector<models::data::Batch> batches(int n) { return packed_addition_batches(n); }

struct Result {
  std::vector<Tensor> losses;
  std::map<std::string, Tensor> grads;
};

void expect_equal(const Result& a, const Result& b, const std::string& what) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i) EXPECT_TRUE(all_close(a.losses[i], b.losses[i], 0, 0)) << what;
  for (const auto& [name, g] : b.grads) {
    ASSERT_TRUE(a.grads.at(name).defined()) << what << " " << name;
    EXPECT_TRUE(all_close(a.grads.at(name), g, 0, 0)) << what << " " << name;
  }
}

// Two micro-batches accumulated through the fused classifier, as the trainer runs them.
Result train_step(GPTOptions o, RecomputeMode mode, int64_t layers) {
  o.recompute = mode;
  o.recompute_layers = layers;
  Generator gen(5);
  GPT model(o, &gen);
  Result r;
  for (const models::data::Batch& batch : batches(2)) {
    const GPTBatch b = make_gpt_batch(models::data::shard_for_rank(batch, 1, 0));
    const Tensor loss = model.forward_loss(b.input, b.labels, b.num_valid_labels);
    backward(loss);
    r.losses.push_back(loss.detach());
  }
  for (const auto& [name, p] : model.named_parameters()) r.grads[name] = p.grad();
  return r;
}

TEST(GPTRecompute, EqualsNoRecomputationBitForBit) {
  for (AttentionType attention : {AttentionType::mha, AttentionType::gqa, AttentionType::mla}) {
    for (nn::Activation mlp : {nn::Activation::gelu, nn::Activation::swiglu}) {
      const GPTOptions o = options(attention, mlp);
      const Result plain = train_step(o, RecomputeMode::none, 0);
      const std::string what =
          "attention " + std::to_string(static_cast<int>(attention)) + " mlp " + std::to_string(static_cast<int>(mlp));
      expect_equal(train_step(o, RecomputeMode::full, 0), plain, what + " full");
      expect_equal(train_step(o, RecomputeMode::selective, 0), plain, what + " selective");
      expect_equal(train_step(o, RecomputeMode::full, 2), plain, what + " full, first 2 blocks");
    }
  }
}

TEST(GPTRecompute, LearnedPositionsSinksAndWindow) {
  GPTOptions o = options(AttentionType::gqa, nn::Activation::swiglu);
  o.positions = PositionType::learned;
  o.max_positions = 32;
  o.tie_embeddings = false;
  o.attention_sink = true;
  o.window = 5;
  const Result plain = train_step(o, RecomputeMode::none, 0);
  expect_equal(train_step(o, RecomputeMode::full, 0), plain, "full");
  expect_equal(train_step(o, RecomputeMode::selective, 1), plain, "selective, first block");
}

// Each rank's loss and gradients with recomputation equal the same rank's without it.
Result cp_rank_step(const GPTOptions& o, cp::CommType comm, int cp_size, dist::RankContext& ctx,
                    const models::data::Batch& batch) {
  const bool hierarchical = comm == cp::CommType::a2a_p2p;
  dist::DeviceMesh mesh(ctx.world,
                        {.dp = 1, .cp = cp_size, .cp_a2a = hierarchical ? 2 : 0, .hierarchical_cp = hierarchical});
  const cp::ContextParallel cp{comm, mesh.cp(), mesh.cp_a2a(), mesh.cp_p2p()};
  Generator gen(5);
  GPT model(o, &gen);
  const GPTBatch b = make_gpt_batch(models::data::shard_for_rank(batch, cp_size, ctx.rank));
  const Tensor loss = model.forward_loss(b.input, b.labels, b.global_num_valid_labels, -1, &cp);
  backward(loss);
  Result r;
  r.losses.push_back(loss.detach());
  for (const auto& [name, p] : model.named_parameters()) r.grads[name] = p.grad();
  return r;
}

void expect_cp_recompute_matches(AttentionType attention, cp::CommType comm, int cp_size) {
  const models::data::Batch batch = batches(1).front();
  const std::string what = cp::comm_type_name(comm) + " cp=" + std::to_string(cp_size);
  std::mutex mu;
  dist::launch(cp_size, [&](dist::RankContext& ctx) {
    GPTOptions o = options(attention, nn::Activation::swiglu);
    const Result plain = cp_rank_step(o, comm, cp_size, ctx, batch);
    o.recompute = RecomputeMode::full;
    const Result full = cp_rank_step(o, comm, cp_size, ctx, batch);
    o.recompute = RecomputeMode::selective;
    const Result selective = cp_rank_step(o, comm, cp_size, ctx, batch);
    std::lock_guard<std::mutex> lock(mu);
    expect_equal(full, plain, what + " full rank " + std::to_string(ctx.rank));
    expect_equal(selective, plain, what + " selective rank " + std::to_string(ctx.rank));
  });
}

TEST(GPTRecompute, EveryContextParallelStrategy) {
  expect_cp_recompute_matches(AttentionType::mha, cp::CommType::p2p, 2);
  expect_cp_recompute_matches(AttentionType::gqa, cp::CommType::all_gather, 2);
  expect_cp_recompute_matches(AttentionType::gqa, cp::CommType::a2a, 2);
  expect_cp_recompute_matches(AttentionType::mha, cp::CommType::a2a_p2p, 4);
  expect_cp_recompute_matches(AttentionType::mla, cp::CommType::p2p, 2);
}

TEST(GPTRecompute, EvaluationKeepsNothingAndMatches) {
  GPTOptions o = options(AttentionType::mha, nn::Activation::gelu);
  Generator gen(5);
  const GPT plain(o, &gen);
  o.recompute = RecomputeMode::full;
  Generator gen2(5);
  const GPT recomputed(o, &gen2);
  const GPTBatch b = make_gpt_batch(models::data::shard_for_rank(batches(1).front(), 1, 0));
  NoGradGuard no_grad;
  EXPECT_TRUE(all_close(recomputed.forward(b.input), plain.forward(b.input), 0, 0));
}

// Records the calls a model makes (what ZeroShards would gather and free).
class RecordingUnits final : public nn::ParameterUnits {
 public:
  void acquire(size_t unit, std::optional<size_t> next) const override {
    calls.push_back("+" + std::to_string(unit) + (next ? ">" + std::to_string(*next) : ""));
  }
  void release(size_t unit) const override { calls.push_back("-" + std::to_string(unit)); }
  mutable std::vector<std::string> calls;
};

// Units 0..2 are the blocks, 3 the root: the forward takes the root (kept) and each block with the next
// one prefetched; the backward recomputes the blocks in reverse, each prefetching the one before it.
TEST(GPTRecompute, ShardedParameterUnitsInOrder) {
  for (RecomputeMode mode : {RecomputeMode::full, RecomputeMode::selective}) {
    GPTOptions o = options(AttentionType::gqa, nn::Activation::swiglu);
    o.recompute = mode;
    GPT model(o);
    const std::vector<std::vector<size_t>> units = model.parameter_units();
    ASSERT_EQ(units.size(), 4u);
    const auto named = model.named_parameters();
    for (size_t i = 0; i < 3; ++i) {
      for (size_t k : units[i]) EXPECT_EQ(named[k].first.rfind("blocks." + std::to_string(i) + ".", 0), 0u);
    }
    for (size_t k : units[3]) EXPECT_NE(named[k].first.rfind("blocks.", 0), 0u) << named[k].first;
    RecordingUnits recording;
    model.set_parameter_units(&recording);
    const GPTBatch b = make_gpt_batch(models::data::shard_for_rank(batches(1).front(), 1, 0));
    backward(model.forward_loss(b.input, b.labels, b.num_valid_labels));
    const std::vector<std::string> expected = {"+3>0", "+0>1", "-0",   "+1>2", "-1", "+2", "-2",
                                               "+2>1", "-2",   "+1>0", "-1",   "+0", "-0"};
    EXPECT_EQ(recording.calls, expected);
  }
}

TEST(GPTRecompute, OptionChecks) {
  GPTOptions o = options(AttentionType::mha, nn::Activation::gelu);
  o.recompute = RecomputeMode::full;
  o.recompute_layers = 4;
  EXPECT_CPF_ERROR(GPT{o}, "recompute_layers=4 must be 0 (every block) or at most num_layers=3");
  o.recompute = RecomputeMode::none;
  o.recompute_layers = 2;
  EXPECT_CPF_ERROR(GPT{o}, "recompute_layers=2 needs model.recompute: selective or full");
  o.recompute_layers = 0;
  GPT model(o);
  model.set_parameter_units(nullptr);  // null: every parameter resident, always allowed
  const RecordingUnits units;
  EXPECT_CPF_ERROR(model.set_parameter_units(&units),
                   "GPT: sharded parameters (parallel.shard: parameters) need every block recomputed");
}

}  // namespace
}  // namespace cpf::models
