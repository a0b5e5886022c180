// Gradients of the differentiable collectives, two ways: a finite-difference check across ranks in
// lockstep (dist::gradcheck), and the analytic gradient of the equivalent single-process
// computation (cat / narrow / add of every rank's input) compared with each rank's gradient.
#include <gtest/gtest.h>

#include "distributed/dist_test_utils.h"
#include "framework/autograd/ops.h"
#include "framework/distributed/autograd_collectives.h"
#include "framework/distributed/gradcheck.h"

namespace cpf::testing {
namespace {

using dist::ProcessGroup;
using Fn = std::function<Tensor(const Tensor&, ProcessGroup&)>;

// Runs dist::gradcheck of out = fn(x) on n ranks; rank r's input has shape shape_of(r).
void expect_dist_gradcheck(int n, const std::function<Shape(int)>& shape_of, const Fn& fn) {
  run_ranks(n, [&](RankContext& ctx) {
    Tensor x = grad_input(shape_of(ctx.rank), 100 + static_cast<uint64_t>(ctx.rank));
    ProcessGroup& pg = *ctx.world;
    const auto report =
        dist::gradcheck(pg, [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{fn(in[0], pg)}; }, {x},
                        {.max_elements_per_input = 6});
    EXPECT_TRUE(report.ok) << "rank " << ctx.rank << ": " << report.str();
    EXPECT_GT(report.checked, 0);
  });
}

// Compares each rank's gradient of L = sum_r <w_r, fn(x_r)> with the gradient of the same L computed
// in one process by `serial` (which maps all ranks' inputs to all ranks' outputs).
void expect_matches_serial(int n, const std::function<Shape(int)>& shape_of, const Fn& fn,
                           const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& serial) {
  std::vector<Tensor> xs;
  for (int r = 0; r < n; ++r) xs.push_back(grad_input(shape_of(r), 200 + static_cast<uint64_t>(r)));
  const std::vector<Tensor> ys = serial(xs);
  std::vector<Tensor> weights;
  Tensor loss = scalar_tensor(0.0, {.dtype = DType::f64});
  for (int r = 0; r < n; ++r) {
    weights.push_back(make_input(ys[static_cast<size_t>(r)].shape(), DType::f64, 300 + static_cast<uint64_t>(r)));
    loss = cpf::add(loss, cpf::sum(cpf::mul(ys[static_cast<size_t>(r)], weights.back())));
  }
  cpf::backward(loss);
  run_ranks(n, [&](RankContext& ctx) {
    Tensor x = grad_input(shape_of(ctx.rank), 200 + static_cast<uint64_t>(ctx.rank));
    const Tensor y = fn(x, *ctx.world);
    cpf::backward(y, weights[static_cast<size_t>(ctx.rank)]);
    ASSERT_TRUE(x.grad().defined());
    EXPECT_TRUE(all_close(x.grad(), xs[static_cast<size_t>(ctx.rank)].grad(), 1e-12, 1e-12)) << "rank " << ctx.rank;
  });
}

class AutogradCollectiveTest : public ::testing::TestWithParam<int> {
 protected:
  int n() const { return GetParam(); }
};

TEST_P(AutogradCollectiveTest, AllGatherOfUnevenPieces) {
  const auto shape_of = [](int r) { return Shape{2, 1 + r % 2, 3}; };
  const Fn gather = [](const Tensor& x, ProcessGroup& pg) { return dist::all_gather(x, 1, pg); };
  expect_dist_gradcheck(n(), shape_of, [&](const Tensor& x, ProcessGroup& pg) {
    const Tensor y = gather(x, pg);
    return cpf::mul(y, y);  // non-linear: the check sees the gradient flow through the collective
  });
  expect_matches_serial(n(), shape_of, gather, [n = n()](const std::vector<Tensor>& xs) {
    return std::vector<Tensor>(static_cast<size_t>(n), cpf::cat(xs, 1));
  });
}

TEST_P(AutogradCollectiveTest, ReduceScatterSumAndAvg) {
  const auto shape_of = [n = n()](int) { return Shape{2 * n + 1, 2}; };  // uneven pieces
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
    const Fn scatter = [op](const Tensor& x, ProcessGroup& pg) { return dist::reduce_scatter(x, 0, pg, op); };
    expect_dist_gradcheck(n(), shape_of, [&](const Tensor& x, ProcessGroup& pg) { return cpf::tanh(scatter(x, pg)); });
    expect_matches_serial(n(), shape_of, scatter, [n = n(), op](const std::vector<Tensor>& xs) {
      Tensor total = xs[0];
      for (size_t s = 1; s < xs.size(); ++s) total = cpf::add(total, xs[s]);
      if (op == ReduceOp::avg) total = cpf::mul(total, 1.0 / n);
      std::vector<Tensor> out;
      int64_t offset = 0;
      for (int64_t size : dist::even_splits(total.size(0), n)) {
        out.push_back(cpf::narrow(total, 0, offset, size));
        offset += size;
      }
      return out;
    });
  }
}

TEST_P(AutogradCollectiveTest, AllToAllAndItsInverse) {
  const auto shape_of = [n = n()](int) { return Shape{1, 2, 2 * n, 2}; };  // (B, S/P, H, D)
  const Fn ulysses = [](const Tensor& x, ProcessGroup& pg) { return dist::all_to_all(x, 2, 1, pg); };
  expect_dist_gradcheck(n(), shape_of, [&](const Tensor& x, ProcessGroup& pg) {
    const Tensor h = ulysses(x, pg);                    // (B, S, H/P, D)
    return dist::all_to_all(cpf::mul(h, h), 1, 2, pg);  // back to (B, S/P, H, D)
  });
  expect_matches_serial(n(), shape_of, ulysses, [n = n()](const std::vector<Tensor>& xs) {
    std::vector<Tensor> out;
    for (int r = 0; r < n; ++r) {
      std::vector<Tensor> pieces;
      for (const Tensor& x : xs) pieces.push_back(cpf::narrow(x, 2, 2 * r, 2));
      out.push_back(cpf::cat(pieces, 1));
    }
    return out;
  });
}

TEST_P(AutogradCollectiveTest, AllReduceSumAndAvg) {
  const auto shape_of = [](int) { return Shape{3, 2}; };
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
    const Fn reduce = [op](const Tensor& x, ProcessGroup& pg) { return dist::all_reduce(x, pg, op); };
    expect_dist_gradcheck(n(), shape_of, [&](const Tensor& x, ProcessGroup& pg) { return cpf::mul(reduce(x, pg), x); });
    expect_matches_serial(n(), shape_of, reduce, [n = n(), op](const std::vector<Tensor>& xs) {
      Tensor total = xs[0];
      for (size_t s = 1; s < xs.size(); ++s) total = cpf::add(total, xs[s]);
      if (op == ReduceOp::avg) total = cpf::mul(total, 1.0 / n);
      return std::vector<Tensor>(static_cast<size_t>(n), total);
    });
  }
}

TEST_P(AutogradCollectiveTest, SendRecvRingStep) {
  const auto shape_of = [](int) { return Shape{2, 3}; };
  const Fn ring = [](const Tensor& x, ProcessGroup& pg) {
    return dist::send_recv(x, (pg.rank() + 1) % pg.size(), (pg.rank() + pg.size() - 1) % pg.size(), pg);
  };
  // Two ring steps in a row, as ring attention does with its KV blocks.
  expect_dist_gradcheck(n(), shape_of, [&](const Tensor& x, ProcessGroup& pg) {
    const Tensor once = ring(x, pg);
    return cpf::mul(ring(once, pg), once);
  });
  expect_matches_serial(n(), shape_of, ring, [n = n()](const std::vector<Tensor>& xs) {
    std::vector<Tensor> out;
    for (int r = 0; r < n; ++r) out.push_back(xs[static_cast<size_t>((r + n - 1) % n)]);
    return out;
  });
}

INSTANTIATE_TEST_SUITE_P(Sizes, AutogradCollectiveTest, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) { return "n" + std::to_string(info.param); });

TEST(AutogradCollectiveTest, SplitSendAndRecvCarryTheGradientBack) {
  run_ranks(2, [](RankContext& ctx) {
    ProcessGroup& pg = *ctx.world;
    if (ctx.rank == 0) {
      Tensor x = grad_input({2, 3}, 7);
      const Tensor token = dist::send(cpf::mul(x, 3.0), 1, pg);
      EXPECT_EQ(token.dim(), 0);
      EXPECT_EQ(token.item<double>(), 0.0);
      cpf::backward(token);  // waits for rank 1's gradient
      // Rank 1's loss is sum(z^2) with z = 3x, so dL/dx = 3 * 2z = 18x.
      EXPECT_TRUE(all_close(x.grad(), raw::mul(x.detach(), 18.0), 1e-12, 1e-12));
    } else {
      const Tensor z = dist::recv({2, 3}, 0, pg, {.dtype = DType::f64, .requires_grad = true});
      EXPECT_TRUE(z.requires_grad());
      cpf::backward(cpf::sum(cpf::mul(z, z)));
      const Tensor plain = dist::recv({1}, 0, pg, {.dtype = DType::f64, .requires_grad = false});
      EXPECT_FALSE(plain.requires_grad());
    }
    if (ctx.rank == 0) pg.send(ones({1}, {.dtype = DType::f64}), 1);
  });
}

TEST(AutogradCollectiveTest, AllReduceGradientsAveragesEveryParameter) {
  run_ranks(3, [](RankContext& ctx) {
    const double r = ctx.rank;
    Tensor w = zeros({2, 2}, {.dtype = DType::f64});
    Tensor b = zeros({3});  // f32: a second bucket
    Tensor frozen = zeros({4});
    w.set_requires_grad(true);
    b.set_requires_grad(true);
    w.set_grad(full({2, 2}, r, {.dtype = DType::f64}));
    b.set_grad(full({3}, 2 * r));
    dist::all_reduce_gradients({w, b, frozen}, *ctx.world);
    EXPECT_TRUE(all_close(w.grad(), full({2, 2}, 1.0, {.dtype = DType::f64})));  // mean of 0, 1, 2
    EXPECT_TRUE(all_close(b.grad(), full({3}, 2.0)));
    EXPECT_FALSE(frozen.grad().defined());
    dist::all_reduce_gradients({w}, *ctx.world, ReduceOp::sum);
    EXPECT_TRUE(all_close(w.grad(), full({2, 2}, 3.0, {.dtype = DType::f64})));
  });
}

TEST(AutogradCollectiveTest, RejectsReductionsWithoutAGradient) {
  run_ranks(2, [](RankContext& ctx) {
    EXPECT_CPF_ERROR(dist::all_reduce(ones({2}), *ctx.world, ReduceOp::max),
                     "dist::all_reduce: only sum and avg are differentiable, got max; use ProcessGroup::all_reduce");
    EXPECT_CPF_ERROR(dist::reduce_scatter(ones({2}), 0, *ctx.world, ReduceOp::min),
                     "dist::reduce_scatter: only sum and avg are differentiable, got min");
    Tensor f32 = ones({2});
    f32.set_requires_grad(true);
    EXPECT_CPF_ERROR(dist::gradcheck(*ctx.world, [](const std::vector<Tensor>& in) { return in; }, {f32}),
                     "dist::gradcheck: input 0 of shape [2] is f32; finite differences need f64 inputs");
    EXPECT_CPF_ERROR(dist::gradcheck(*ctx.world, [](const std::vector<Tensor>& in) { return in; }, {f32}, {.eps = 0}),
                     "dist::gradcheck: eps must be positive, got 0");
  });
}

}  // namespace
}  // namespace cpf::testing
