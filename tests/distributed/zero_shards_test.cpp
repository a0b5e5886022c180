// ZeroShards (framework/distributed/zero_shards.h) and the reducer's sharded gradients on the thread
// backend: the pieces of every rank cover each parameter element exactly once (bucket sizes that W does
// not divide), each rank's optimizer holds about 1/W of the state, the sharded AdamW step followed by
// gather_parameters equals the replicated step bit for bit (stage optimizer and gradients, f32 and bf16
// matrices), full_state equals the replicated optimizer's state and load_full_state restores it; stage
// parameters (ZeRO-3) holds no whole parameter outside acquire/release, refuses to read one, and its steps
// equal the replicated ones bit for bit; and the refusals name what is wrong.
#include "framework/distributed/zero_shards.h"

#include <gtest/gtest.h>

#include "dist_test_utils.h"
#include "framework/autograd/engine.h"
#include "framework/distributed/autograd_collectives.h"
#include "framework/optim/adamw.h"
#include "grad_reducer_model.h"

namespace cpf::testing {
namespace {

using dist::ShardStage;

optim::NamedTensors named(const std::vector<Tensor>& params) {
  optim::NamedTensors out;
  for (size_t i = 0; i < params.size(); ++i) out.emplace_back("p" + std::to_string(i), params[i]);
  return out;
}

TEST(ZeroShards, PiecesCoverEveryElementOnce) {
  const std::vector<int64_t> numels = {7, 5, 13, 1, 9};
  std::vector<Tensor> params;
  for (int64_t n : numels) params.push_back(zeros({n}));
  for (int64_t bucket_bytes : {int64_t{1}, int64_t{40}, int64_t{1} << 20}) {
    const auto plan = dist::plan_gradient_buckets(params, bucket_bytes);
    for (int world : {1, 2, 3, 4, 8}) {
      std::vector<std::vector<int>> owners(numels.size());
      for (size_t p = 0; p < numels.size(); ++p) owners[p].assign(static_cast<size_t>(numels[p]), 0);
      for (int r = 0; r < world; ++r) {
        for (const dist::ShardPiece& piece : dist::plan_shard_pieces(plan, numels, r, world)) {
          for (int64_t e = piece.param_begin; e < piece.param_begin + piece.numel; ++e) ++owners[piece.param][e];
        }
      }
      for (size_t p = 0; p < numels.size(); ++p) {
        for (int count : owners[p]) EXPECT_EQ(count, 1) << "world " << world << " bucket_bytes " << bucket_bytes;
      }
    }
  }
}

optim::AdamWOptions adamw() { return {.lr = 0.01, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1}; }

// Three steps of the tiny model: sharded (reducer + ZeroShards + AdamW over pieces) against replicated
// (all-reduce + AdamW over the parameters), compared after every step; then the state.
void expect_sharded_equals_replicated(int ranks, ShardStage stage, DType matrix_dtype) {
  run_ranks(ranks, [&](RankContext& ctx) {
    TinyModel model(matrix_dtype, /*with_unused=*/false);
    TinyModel reference = model.copy();
    dist::GradientReducer reducer(
        model.params, ctx.world,
        {.bucket_bytes = 300, .op = ReduceOp::avg, .shard_gradients = stage == ShardStage::gradients});
    dist::ZeroShards shards(named(model.params), reducer.buckets(), ctx.world, stage);
    const auto groups = optim::weight_decay_groups(named(model.params), 0.1);
    optim::AdamW sharded(shards.piece_groups(groups), adamw());
    optim::AdamW replicated(named(reference.params), adamw());
    int64_t state_numel = 0, model_numel = 0;
    for (const auto& [name, t] : sharded.state_tensors()) state_numel += t.numel();
    for (const Tensor& p : model.params) model_numel += 2 * p.numel();
    EXPECT_LE(state_numel, model_numel / ranks + 2 * 4 * ranks) << "about 1/" << ranks << " of the state";
    for (int step = 0; step < 3; ++step) {
      backward(model.loss(ctx.rank, step));
      reducer.finish();
      if (stage == ShardStage::gradients) {
        for (const Tensor& p : model.params) EXPECT_FALSE(p.grad().defined()) << "dropped once in its bucket";
      }
      shards.take_gradients(reducer);
      sharded.step();
      shards.gather_parameters();
      shards.zero_grad();
      backward(reference.loss(ctx.rank, step));
      dist::all_reduce_gradients(reference.params, *ctx.world, ReduceOp::avg);
      replicated.step();
      replicated.zero_grad();
      for (size_t i = 0; i < model.params.size(); ++i) {
        EXPECT_TRUE(same_tensor(model.params[i], reference.params[i])) << "rank " << ctx.rank << " step " << step;
      }
    }
    const optim::NamedTensors full = shards.full_state(sharded);
    const optim::NamedTensors replicated_state = replicated.state_tensors();
    std::map<std::string, Tensor> expected(replicated_state.begin(), replicated_state.end());
    ASSERT_EQ(full.size(), expected.size());
    for (const auto& [name, t] : full) EXPECT_TRUE(same_tensor(t, expected.at(name))) << name;
    optim::AdamW restored(shards.piece_groups(groups), adamw());
    shards.load_full_state(restored, full, sharded.step_count());
    EXPECT_EQ(restored.step_count(), 3);
    const optim::NamedTensors loaded = restored.state_tensors(), original = sharded.state_tensors();
    ASSERT_EQ(loaded.size(), original.size());
    for (size_t i = 0; i < loaded.size(); ++i) EXPECT_TRUE(same_tensor(loaded[i].second, original[i].second));
  });
}

TEST(ZeroShards, OptimizerStageEqualsReplicatedAdamW) {
  expect_sharded_equals_replicated(2, ShardStage::optimizer, DType::f32);
  expect_sharded_equals_replicated(3, ShardStage::optimizer, DType::bf16);
}

TEST(ZeroShards, GradientsStageEqualsReplicatedAdamW) {
  expect_sharded_equals_replicated(2, ShardStage::gradients, DType::f32);
  expect_sharded_equals_replicated(4, ShardStage::gradients, DType::bf16);
}

// The tiny model's units: the embedding (0), the first layer (1: w1, b1), the second (2: w2, g); buckets in
// backward order, unit u in bucket 2 - u.
const std::vector<std::vector<size_t>> kTinyBuckets = {{3, 4}, {1, 2}, {0}};
const std::vector<size_t> kTinyUnitBuckets = {2, 1, 0};

// A parameter outside its unit has no memory, and reading it is an error naming why.
void expect_released(const std::vector<Tensor>& params) {
  for (const Tensor& p : params) {
    EXPECT_EQ(p.storage()->nbytes(), 0u);
    EXPECT_CPF_ERROR(p.to_vector<float>(),
                     "has no memory: its storage was released (a parameter sharded with "
                     "parallel.shard: parameters, read outside the acquire/release");
  }
}

TEST(ZeroShards, ParametersStageEqualsReplicatedAdamW) {
  for (int ranks : {2, 3}) {
    run_ranks(ranks, [&](RankContext& ctx) {
      TinyModel model(DType::f32, /*with_unused=*/false);
      TinyModel reference = model.copy();
      dist::GradientReducer reducer(model.params, ctx.world,
                                    {.op = ReduceOp::avg, .shard_gradients = true, .buckets = kTinyBuckets});
      dist::ZeroShards shards(named(model.params), reducer.buckets(), ctx.world, ShardStage::parameters,
                              kTinyUnitBuckets);
      expect_released(model.params);
      const auto groups = optim::weight_decay_groups(named(model.params), 0.1);
      optim::AdamW sharded(shards.piece_groups(groups), adamw());
      optim::AdamW replicated(named(reference.params), adamw());
      for (int step = 0; step < 3; ++step) {
        shards.acquire(0, size_t{1});  // as a model does: each unit ahead of its use, the next one prefetched
        shards.acquire(1, size_t{2});
        shards.acquire(2, std::nullopt);
        backward(model.loss(ctx.rank, step));
        reducer.finish();
        shards.release_all();
        expect_released(model.params);
        shards.take_gradients(reducer);
        sharded.step();
        shards.gather_parameters();  // nothing at this stage
        shards.zero_grad();
        backward(reference.loss(ctx.rank, step));
        dist::all_reduce_gradients(reference.params, *ctx.world, ReduceOp::avg);
        replicated.step();
        replicated.zero_grad();
        shards.acquire_all();
        shards.release(1);  // pinned: stays whole
        for (size_t i = 0; i < model.params.size(); ++i) {
          EXPECT_TRUE(same_tensor(model.params[i], reference.params[i])) << "rank " << ctx.rank << " step " << step;
        }
        shards.release_all();
      }
      const optim::NamedTensors full = shards.full_state(sharded);
      const optim::NamedTensors replicated_state = replicated.state_tensors();
      std::map<std::string, Tensor> expected(replicated_state.begin(), replicated_state.end());
      for (const auto& [name, t] : full) EXPECT_TRUE(same_tensor(t, expected.at(name))) << name;
    });
  }
}

// adopt_parameters: values written into the whole parameters (a checkpoint load) become the pieces'.
TEST(ZeroShards, ParametersStageAdoptsLoadedValues) {
  run_ranks(2, [&](RankContext& ctx) {
    TinyModel model(DType::f32, false);
    const auto plan = dist::plan_explicit_buckets(model.params, kTinyBuckets);
    dist::ZeroShards shards(named(model.params), plan, ctx.world, ShardStage::parameters, kTinyUnitBuckets);
    shards.acquire_all();
    for (size_t i = 0; i < model.params.size(); ++i) raw::fill_(model.params[i], 0.25 * static_cast<double>(i));
    shards.adopt_parameters();
    expect_released(model.params);
    shards.acquire(1, std::nullopt);
    EXPECT_EQ(model.params[1].to_vector<float>(), std::vector<float>(model.params[1].numel(), 0.25f));
    EXPECT_EQ(model.params[2].to_vector<float>(), std::vector<float>(model.params[2].numel(), 0.5f));
    shards.release(1);
    expect_released(model.params);
  });
}

TEST(ZeroShards, Refusals) {
  run_ranks(2, [&](RankContext& ctx) {
    TinyModel model(DType::f32, false);
    const auto plan = dist::plan_gradient_buckets(model.params, 1 << 20);
    EXPECT_CPF_ERROR(dist::ZeroShards(named(model.params), plan, ctx.world, ShardStage::parameters),
                     "ZeroShards: stage parameters needs one unit per bucket: 0 units for 1 buckets");
    EXPECT_CPF_ERROR(dist::ZeroShards(named(model.params), plan, ctx.world, ShardStage::optimizer, {0}),
                     "ZeroShards: units are for stage parameters, not optimizer");
    EXPECT_CPF_ERROR(dist::ZeroShards(named(model.params), plan, ctx.world, ShardStage::none),
                     "ZeroShards: stage none shards nothing");
    EXPECT_CPF_ERROR(dist::plan_explicit_buckets(model.params, {{0, 1}, {1, 2, 3, 4}}),
                     "GradientReducer: parameter 1 is in explicit buckets 0 and 1; list each parameter once");
    EXPECT_CPF_ERROR(dist::plan_explicit_buckets(model.params, {{0, 1, 2, 3}}),
                     "GradientReducer: parameter 4 of shape [8] is in no explicit bucket");
    dist::ZeroShards shards(named(model.params), plan, ctx.world, ShardStage::optimizer);
    EXPECT_CPF_ERROR(shards.acquire(0, std::nullopt),
                     "ZeroShards: units are acquired under stage parameters only, not optimizer");
    optim::AdamW opt(shards.piece_groups(optim::weight_decay_groups(named(model.params), 0.1)), adamw());
    EXPECT_CPF_ERROR(shards.load_full_state(opt, {}, 0), "ZeroShards: the state holds no 'exp_avg.p");
    dist::GradientReducer reducer(model.params, ctx.world, {.op = ReduceOp::avg});
    EXPECT_CPF_ERROR(reducer.shard(0), "the reducer all-reduces (shard_gradients is off)");
    EXPECT_CPF_ERROR(shards.take_gradients(reducer), "has no gradient after the reducer's finish()");
  });
  std::vector<Tensor> one{zeros({1}).set_requires_grad(true)};
  run_ranks(2, [&](RankContext& ctx) {
    const auto plan = dist::plan_gradient_buckets(one, 1 << 20);
    if (ctx.rank == 1) {
      EXPECT_CPF_ERROR(dist::ZeroShards(named(one), plan, ctx.world, ShardStage::optimizer),
                       "rank 1 owns no element of any parameter");
    }
  });
}

}  // namespace
}  // namespace cpf::testing
