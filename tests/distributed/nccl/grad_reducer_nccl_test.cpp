// GradientReducer (framework/distributed/grad_reducer.h) over NCCL, one rank per GPU: the reduced
// gradients against all_reduce_gradients on a copy of the model, bucket sizes from one parameter per
// bucket to one per dtype, f32 and bf16 matrices, two SGD steps (bucket buffers reused across steps,
// ordered by streams only), buckets started during backward, and the cross-rank layout check.
// Skips below 2 GPUs. Failures name n, rank, bucket size, dtype, step and parameter.
#include "distributed/grad_reducer_model.h"
#include "framework/autograd/engine.h"
#include "framework/distributed/autograd_collectives.h"
#include "framework/distributed/grad_reducer.h"
#include "tests/distributed/nccl/nccl_test_utils.h"

namespace cpf::testing {
namespace {

using dist::GradientReducer;

class NcclGradientReducer : public MultiGpuTest {};

// NCCL sums in its own order, which depends on the message size: a bucket of one parameter and
// one bucket of everything need not agree in the last bits. f32: a few ulps; bf16 gradients are
// rounded to bf16 at each ring step (nccl_test_utils.h).
double gradient_tolerance(DType dtype) { return dtype == DType::bf16 ? 1.5e-2 : 1e-6; }

TEST_F(NcclGradientReducer, MatchesAllReduceGradientsOverTwoSteps) {
  for (int n : world_sizes()) {
    for (int64_t bucket_bytes : {int64_t{1}, int64_t{600}, int64_t{1} << 30}) {
      for (DType matrix_dtype : {DType::f32, DType::bf16}) {
        run_nccl(n, [&](RankContext& ctx) {
          TinyModel model(matrix_dtype, /*with_unused=*/false, ctx.device);
          TinyModel reference = model.copy();
          GradientReducer reducer(model.params, ctx.world, {.bucket_bytes = bucket_bytes});
          for (int step = 0; step < 2; ++step) {
            const std::string what =
                str_cat("n=", n, " rank ", ctx.rank, " bucket_bytes ", bucket_bytes, " ", matrix_dtype, " step ", step);
            backward(model.loss(ctx.rank, step));
            EXPECT_EQ(reducer.buckets_started(), reducer.buckets().size()) << what << ": started during backward";
            reducer.finish();
            backward(reference.loss(ctx.rank, step));
            dist::all_reduce_gradients(reference.params, *ctx.world);
            for (size_t i = 0; i < model.params.size(); ++i) {
              const Tensor& g = model.params[i].grad();
              ASSERT_TRUE(g.defined()) << what << " parameter " << i;
              EXPECT_EQ(g.device(), ctx.device) << what << " parameter " << i;
              const Tensor expected = raw::to(reference.params[i].grad(), Device::cpu());
              EXPECT_TRUE(matches(g, expected, gradient_tolerance(g.dtype()))) << what << " parameter " << i;
            }
            sgd_step(model.params);
            sgd_step(reference.params);
          }
        });
      }
    }
  }
}

TEST_F(NcclGradientReducer, UnusedParameterGetsZerosOnEveryRank) {
  run_nccl(2, [](RankContext& ctx) {
    TinyModel model(DType::f32, /*with_unused=*/true, ctx.device);
    GradientReducer reducer(model.params, ctx.world, {.bucket_bytes = 1, .op = ReduceOp::sum});
    backward(model.loss(ctx.rank, 0));
    reducer.finish();
    EXPECT_EQ(reducer.buckets_started_in_backward(), 2u) << "rank " << ctx.rank;
    EXPECT_TRUE(matches(model.params[3].grad(), zeros({3, 2}), 0)) << "rank " << ctx.rank;
  });
}

TEST_F(NcclGradientReducer, DifferentParameterListsFailOnEveryRank) {
  run_nccl(2, [](RankContext& ctx) {
    std::vector<Tensor> params;
    params.push_back(zeros({4}, {.device = ctx.device}).set_requires_grad(true));
    if (ctx.rank == 0) params.push_back(zeros({2, 3}, {.device = ctx.device}).set_requires_grad(true));
    EXPECT_CPF_ERROR(GradientReducer(params, ctx.world), "ranks disagree on the parameters");
  });
}

}  // namespace
}  // namespace cpf::testing
