// GradientReducer (framework/distributed/grad_reducer.h) on the thread backend: bit-identical to
// all_reduce_gradients after backward for a small GPT-like model (tied embedding, MLP, norm) on 2 and
// 4 ranks, with one parameter per bucket, a few per bucket and everything in one; f32, bf16 and mixed
// dtypes; buckets start during backward; parameters without a gradient; consecutive steps; errors.
#include "framework/distributed/grad_reducer.h"

#include <gtest/gtest.h>

#include <atomic>

#include "dist_test_utils.h"
#include "framework/autograd/engine.h"
#include "framework/autograd/grad_mode.h"
#include "framework/autograd/ops.h"
#include "framework/distributed/autograd_collectives.h"
#include "grad_reducer_model.h"

namespace cpf::testing {
namespace {

using dist::GradientReducer;

struct Case {
  int ranks;
  int64_t bucket_bytes;
  DType matrix_dtype;
};

class GradientReducerMatches : public ::testing::TestWithParam<Case> {};

TEST_P(GradientReducerMatches, AllReduceGradientsBitForBitOverTwoSteps) {
  const Case c = GetParam();
  run_ranks(c.ranks, [&](RankContext& ctx) {
    TinyModel model(c.matrix_dtype, /*with_unused=*/false);
    TinyModel reference = model.copy();
    GradientReducer reducer(model.params, ctx.world, {.bucket_bytes = c.bucket_bytes, .op = ReduceOp::avg});
    if (c.bucket_bytes == 1) EXPECT_EQ(reducer.buckets().size(), model.params.size());
    for (int step = 0; step < 2; ++step) {
      backward(model.loss(ctx.rank, step));
      reducer.finish();
      EXPECT_EQ(reducer.buckets_started_in_backward(), reducer.buckets().size())
          << "every parameter got a gradient, so every bucket should start during backward";
      backward(reference.loss(ctx.rank, step));
      dist::all_reduce_gradients(reference.params, *ctx.world, ReduceOp::avg);
      for (size_t i = 0; i < model.params.size(); ++i) {
        EXPECT_TRUE(same_tensor(model.params[i].grad(), reference.params[i].grad()))
            << "rank " << ctx.rank << " step " << step << " parameter " << i;
      }
      sgd_step(model.params);
      sgd_step(reference.params);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(BucketSizes, GradientReducerMatches,
                         ::testing::Values(Case{2, 1, DType::f32}, Case{2, 600, DType::f32},
                                           Case{2, int64_t{1} << 30, DType::f32}, Case{4, 1, DType::f32},
                                           Case{4, 600, DType::bf16}, Case{4, int64_t{1} << 30, DType::bf16},
                                           Case{2, 1, DType::bf16}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           const Case& c = info.param;
                           return "n" + std::to_string(c.ranks) + "_bytes" + std::to_string(c.bucket_bytes) + "_" +
                                  dtype_name(c.matrix_dtype);
                         });

TEST(GradientReducer, PlansBucketsInReverseOrderPerDtype) {
  auto p = [](const Shape& shape, DType dtype) { return zeros(shape, {.dtype = dtype}); };
  // f32 a(4) b(4) c(100); bf16 d(8) e(8): reverse order e, d, c, b, a.
  const std::vector<Tensor> params = {p({4}, DType::f32), p({4}, DType::f32), p({100}, DType::f32), p({8}, DType::bf16),
                                      p({8}, DType::bf16)};
  const auto plan = dist::plan_gradient_buckets(params, 32);  // 32 bytes: 16 bf16 or 8 f32 elements
  ASSERT_EQ(plan.size(), 3u);
  EXPECT_EQ(plan[0].dtype, DType::bf16);
  EXPECT_EQ(plan[0].params, (std::vector<size_t>{4, 3}));
  EXPECT_EQ(plan[0].offsets, (std::vector<int64_t>{0, 8}));
  EXPECT_EQ(plan[0].numel, 16);
  EXPECT_EQ(plan[1].params, (std::vector<size_t>{2})) << "a parameter over the cap fills a bucket alone";
  EXPECT_EQ(plan[1].numel, 100);
  EXPECT_EQ(plan[2].params, (std::vector<size_t>{1, 0}));
  EXPECT_EQ(plan[2].offsets, (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(dist::plan_gradient_buckets(params, int64_t{1} << 20).size(), 2u) << "one bucket per dtype";
  EXPECT_EQ(dist::plan_gradient_buckets(params, 1).size(), params.size());
  EXPECT_CPF_ERROR(dist::plan_gradient_buckets(params, 0), "bucket_bytes must be positive, got 0");
}

TEST(GradientReducer, BucketsStartDuringBackward) {
  run_ranks(2, [](RankContext& ctx) {
    TinyModel model(DType::f32, false);
    // Registered before the reducer's hooks: fires when the tied embedding (the last gradient to
    // complete, and the last bucket) is complete, before the reducer sees it.
    size_t started_when_embedding_ready = 0;
    std::unique_ptr<GradientReducer> reducer;
    auto probe = autograd::add_grad_ready_hook(
        model.params[0], [&](const Tensor&) { started_when_embedding_ready = reducer->buckets_started(); });
    reducer =
        std::make_unique<GradientReducer>(model.params, ctx.world, dist::GradientReducerOptions{.bucket_bytes = 1});
    backward(model.loss(ctx.rank, 0));
    EXPECT_EQ(started_when_embedding_ready, model.params.size() - 1)
        << "the other buckets should have started while backward was still running";
    EXPECT_EQ(reducer->buckets_started(), model.params.size());
    reducer->finish();
    EXPECT_EQ(reducer->buckets_started(), 0u) << "finish() resets the step";
  });
}

TEST(GradientReducer, WithoutStartInBackwardEverythingStartsInFinishWithTheSameResult) {
  run_ranks(2, [](RankContext& ctx) {
    TinyModel model(DType::bf16, false);
    TinyModel reference = model.copy();
    GradientReducer reducer(model.params, ctx.world, {.bucket_bytes = 1, .start_in_backward = false});
    backward(model.loss(ctx.rank, 0));
    EXPECT_EQ(reducer.buckets_started(), 0u);
    reducer.finish();
    EXPECT_EQ(reducer.buckets_started_in_backward(), 0u);
    backward(reference.loss(ctx.rank, 0));
    dist::all_reduce_gradients(reference.params, *ctx.world);
    for (size_t i = 0; i < model.params.size(); ++i) {
      EXPECT_TRUE(same_tensor(model.params[i].grad(), reference.params[i].grad())) << "parameter " << i;
    }
  });
}

TEST(GradientReducer, MicroBatchesWithSyncOffAccumulateThenReduceOnce) {
  run_ranks(2, [](RankContext& ctx) {
    TinyModel model(DType::f32, false);
    TinyModel reference = model.copy();
    GradientReducer reducer(model.params, ctx.world, {.bucket_bytes = 600});
    reducer.set_sync(false);
    backward(model.loss(ctx.rank, 0));
    backward(model.loss(ctx.rank, 1));
    EXPECT_EQ(reducer.buckets_started(), 0u) << "sync off: nothing is sent";
    EXPECT_CPF_ERROR(reducer.finish(), "no parameter received a gradient since the last finish()");
    reducer.set_sync(true);
    backward(model.loss(ctx.rank, 2));
    reducer.finish();
    EXPECT_EQ(reducer.buckets_started_in_backward(), reducer.buckets().size());
    for (int micro = 0; micro < 3; ++micro) backward(reference.loss(ctx.rank, micro));
    dist::all_reduce_gradients(reference.params, *ctx.world);
    for (size_t i = 0; i < model.params.size(); ++i) {
      EXPECT_TRUE(same_tensor(model.params[i].grad(), reference.params[i].grad())) << "parameter " << i;
    }
  });
}

TEST(GradientReducer, ParametersWithoutAGradientGetZerosAndTheRestStillMatches) {
  run_ranks(2, [](RankContext& ctx) {
    TinyModel model(DType::f32, /*with_unused=*/true);
    TinyModel reference = model.copy();
    GradientReducer reducer(model.params, ctx.world, {.bucket_bytes = 1, .op = ReduceOp::sum});
    const size_t unused = 3;
    for (int step = 0; step < 2; ++step) {
      backward(model.loss(ctx.rank, step));
      reducer.finish();
      // Buckets in reverse order: g, w2 start in backward; the unused parameter's bucket holds up
      // its own and every later one until finish().
      EXPECT_EQ(reducer.buckets_started_in_backward(), 2u);
      backward(reference.loss(ctx.rank, step));
      dist::all_reduce_gradients(reference.params, *ctx.world, ReduceOp::sum);
      for (size_t i = 0; i < model.params.size(); ++i) {
        if (i == unused) continue;
        EXPECT_TRUE(same_tensor(model.params[i].grad(), reference.params[i].grad()))
            << "step " << step << " param " << i;
      }
      EXPECT_FALSE(reference.params[unused].grad().defined());
      ASSERT_TRUE(model.params[unused].grad().defined()) << "the reducer defines every gradient";
      EXPECT_TRUE(same_tensor(model.params[unused].grad(), zeros({3, 2})));
      sgd_step(model.params);
      sgd_step(reference.params);
    }
  });
}

TEST(GradientReducer, AGradientOnSomeRanksOnlyIsReducedWithZerosFromTheOthers) {
  run_ranks(3, [](RankContext& ctx) {
    Tensor used = zeros({2});
    Tensor sometimes = zeros({3});
    used.set_requires_grad(true);
    sometimes.set_requires_grad(true);
    GradientReducer reducer({sometimes, used}, ctx.world, {.bucket_bytes = 1, .op = ReduceOp::sum});
    // Rank 1 also sets a gradient by hand on the parameter that backward does not reach.
    if (ctx.rank == 1) sometimes.set_grad(full({3}, 5.0));
    backward(cpf::sum(cpf::mul(used, static_cast<double>(ctx.rank + 1))));
    reducer.finish();
    EXPECT_TRUE(same_tensor(used.grad(), full({2}, 6.0)));       // 1 + 2 + 3
    EXPECT_TRUE(same_tensor(sometimes.grad(), full({3}, 5.0)));  // rank 1's gradient, zeros elsewhere
  });
}

TEST(GradientReducer, FinishWithoutBackwardIsAnError) {
  run_ranks(2, [](RankContext& ctx) {
    TinyModel model(DType::f32, false);
    GradientReducer reducer(model.params, ctx.world);
    EXPECT_CPF_ERROR(reducer.finish(),
                     "GradientReducer::finish on group 'world' (global ranks [0,1]): no parameter "
                     "received a gradient since the last finish(); call backward(loss) first");
    backward(model.loss(ctx.rank, 0));
    reducer.finish();
    EXPECT_CPF_ERROR(reducer.finish(), "no parameter received a gradient since the last finish()");
  });
}

TEST(GradientReducer, TwoBackwardCallsBeforeFinishAreAnError) {
  run_ranks(2, [](RankContext& ctx) {
    TinyModel model(DType::f32, false);
    GradientReducer reducer(model.params, ctx.world, {.bucket_bytes = int64_t{1} << 30});
    backward(model.loss(ctx.rank, 0));
    EXPECT_CPF_ERROR(backward(model.loss(ctx.rank, 1)),
                     "received a second gradient before finish() (two backward calls in one step?); call finish() "
                     "after every backward");
  });
}

TEST(GradientReducer, DifferentParameterListsAreAnErrorOnEveryRankNotAHang) {
  auto params_of = [](const std::vector<Shape>& shapes) {
    std::vector<Tensor> out;
    for (const Shape& s : shapes) out.push_back(zeros(s).set_requires_grad(true));
    return out;
  };
  // A missing parameter.
  run_ranks(2, [&](RankContext& ctx) {
    const auto params = params_of(ctx.rank == 0 ? std::vector<Shape>{{4}, {2, 3}} : std::vector<Shape>{{4}});
    EXPECT_CPF_ERROR(GradientReducer(params, ctx.world),
                     ctx.rank == 0 ? "ranks disagree on the parameters: rank 0 has 2 parameters in 1 buckets (10 "
                                     "elements, op avg) but rank 1 has 1 parameters in 1 buckets (4 elements, op avg)"
                                   : "rank 1 has 1 parameters in 1 buckets (4 elements, op avg) but rank 0 has 2");
  });
  // Same counts, other shapes.
  run_ranks(2, [&](RankContext& ctx) {
    const auto params = params_of(ctx.rank == 0 ? std::vector<Shape>{{2, 3}} : std::vector<Shape>{{3, 2}});
    EXPECT_CPF_ERROR(GradientReducer(params, ctx.world), "and their shapes, dtypes or bucket layout differ");
  });
  // Other options.
  run_ranks(2, [&](RankContext& ctx) {
    const auto params = params_of({{4}, {4}});
    EXPECT_CPF_ERROR(GradientReducer(params, ctx.world, {.bucket_bytes = ctx.rank == 0 ? 1 : 1024}),
                     "every rank must pass the same parameters (same order, shapes and dtypes) with the same options");
  });
}

TEST(GradientReducer, ATimedOutBucketNamesTheBucketAndTheGroup) {
  std::atomic<bool> rank0_done{false};
  // The timeout aborts the world, so the launch reports it too.
  EXPECT_CPF_ERROR(run_ranks(
                       2,
                       [&](RankContext& ctx) {
                         TinyModel model(DType::f32, false);
                         GradientReducer reducer(model.params, ctx.world, {.bucket_bytes = int64_t{1} << 30});
                         if (ctx.rank == 1) return;  // never runs backward: its buckets never start
                         backward(model.loss(ctx.rank, 0));
                         EXPECT_CPF_ERROR(reducer.finish(),
                                          "GradientReducer: bucket 0 of 1 (f32, 368 elements, parameters "
                                          "[4,3,2,1,0]) on group 'world' (global ranks [0,1]): all_reduce on group "
                                          "'world' timed out after 300 ms");
                         rank0_done = true;
                       },
                       std::chrono::milliseconds(300)),
                   "launch: rank 0 failed: all_reduce on group 'world' timed out after 300 ms");
  EXPECT_TRUE(rank0_done.load());
}

TEST(GradientReducer, RejectsBadArguments) {
  run_ranks(1, [](RankContext& ctx) {
    Tensor w = zeros({2}).set_requires_grad(true);
    const std::string where = "GradientReducer on group 'world' (global ranks [0])";
    EXPECT_CPF_ERROR(GradientReducer({w}, nullptr), "GradientReducer: the process group is null");
    EXPECT_CPF_ERROR(GradientReducer({}, ctx.world), where + ": the parameter list is empty");
    EXPECT_CPF_ERROR(GradientReducer({w}, ctx.world, {.op = ReduceOp::max}),
                     where + ": op must be sum or avg, got max");
    EXPECT_CPF_ERROR(GradientReducer({w}, ctx.world, {.bucket_bytes = -5}),
                     where + ": bucket_bytes must be positive, got -5");
    EXPECT_CPF_ERROR(GradientReducer({w, Tensor()}, ctx.world), where + ": parameter 1 is an undefined tensor");
    EXPECT_CPF_ERROR(GradientReducer({w, zeros({3})}, ctx.world),
                     where + ": parameter 1 of shape [3] must be a leaf that requires grad");
    EXPECT_CPF_ERROR(GradientReducer({w, cpf::mul(w, 2.0)}, ctx.world),
                     where + ": parameter 1 of shape [2] must be a leaf that requires grad");
    EXPECT_CPF_ERROR(GradientReducer({w, w}, ctx.world),
                     where + ": parameters 0 and 1 are the same tensor; pass each once");
  });
}

TEST(GradientReducer, AGradientThatDoesNotMatchItsParameterIsAnError) {
  run_ranks(1, [](RankContext& ctx) {
    Tensor used = zeros({2}).set_requires_grad(true);
    Tensor stale = zeros({3}).set_requires_grad(true);
    GradientReducer reducer({stale, used}, ctx.world, {.bucket_bytes = 1});
    // Backward does not reach `stale`; its hand-set gradient (checked for shape only by set_grad)
    // has the wrong dtype, and finish() would reduce it.
    stale.set_grad(zeros({3}, {.dtype = DType::f64}));
    backward(cpf::sum(cpf::mul(used, 2.0)));
    EXPECT_CPF_ERROR(reducer.finish(),
                     "GradientReducer on group 'world' (global ranks [0]): parameter 0 ([3] f32 on "
                     "cpu) has a gradient of [3] f64 on cpu; a gradient must match its parameter");
    // The step was reset: the next one works.
    stale.set_grad(Tensor());
    used.set_grad(Tensor());
    backward(cpf::sum(cpf::mul(used, 2.0)));
    reducer.finish();
    EXPECT_TRUE(same_tensor(used.grad(), full({2}, 2.0)));
    EXPECT_TRUE(same_tensor(stale.grad(), zeros({3})));
  });
}

}  // namespace
}  // namespace cpf::testing
