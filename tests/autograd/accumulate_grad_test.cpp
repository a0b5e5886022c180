// AccumulateGrad adopts a freshly produced gradient as the leaf's first gradient (no copy) only when
// nothing else can see its data; every aliasing case gets a private copy: a gradient a node still holds
// (captured, or an alias of its storage), one handle flowing into two leaves, the caller's seed, and
// a broadcast view. Hooks see the adopted values.
#include <gtest/gtest.h>

#include "framework/autograd/engine.h"
#include "framework/autograd/grad_ready_hook.h"
#include "framework/autograd/node.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/views.h"

namespace cpf {
namespace {

using autograd::GradList;

Tensor leaf(const std::vector<double>& v) {
  Tensor t = from_vector<double>(v, {static_cast<int64_t>(v.size())});
  t.set_requires_grad(true);
  return t;
}

// y = x through a node whose backward is `backward`; then backward(y) with seed 1.
void run(const Tensor& x, autograd::BackwardFn backward) {
  const Tensor y = autograd::record("custom", raw::clone(x.detach()), {x}, std::move(backward));
  cpf::backward(y, full(y.shape(), 1.0, {.dtype = y.dtype()}));
}

TEST(AccumulateGrad, AdoptsAGradientNothingElseHolds) {
  const Tensor x = leaf({1, 2, 3});
  const void* produced = nullptr;
  run(x, [&produced](const GradList& g) {
    Tensor fresh = raw::binary(raw::BinaryOp::mul, g[0], 3.0);  // (3) a new buffer
    produced = fresh.raw_data();
    return GradList{fresh};
  });
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().raw_data(), produced) << "the fresh gradient was copied";
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{3, 3, 3}));
  // A second backward adds into the adopted buffer.
  run(x, [](const GradList& g) { return GradList{raw::binary(raw::BinaryOp::mul, g[0], 2.0)}; });
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{5, 5, 5}));
  EXPECT_EQ(x.grad().raw_data(), produced);
}

TEST(AccumulateGrad, CopiesAGradientTheNodeStillHolds) {
  const Tensor x = leaf({1, 2});
  const Tensor kept = from_vector<double>({4, 5}, {2});
  run(x, [kept](const GradList&) { return GradList{kept}; });  // the same handle the lambda holds
  EXPECT_NE(x.grad().raw_data(), kept.raw_data());
  raw::add_(x.grad(), x.grad());
  EXPECT_EQ(kept.to_vector<double>(), (std::vector<double>{4, 5})) << "the node's tensor changed with the grad";
  // An alias of the held storage (another impl, one storage): copied too.
  const Tensor y = leaf({1, 2});
  run(y, [kept](const GradList&) { return GradList{kept.detach()}; });
  EXPECT_NE(y.grad().raw_data(), kept.raw_data());
}

TEST(AccumulateGrad, OneHandleIntoTwoLeavesGivesEachItsOwnBuffer) {
  const Tensor a = leaf({1, 2}), b = leaf({3, 4});
  const Tensor y = autograd::record("twice", raw::clone(a.detach()), {a, b}, [](const GradList& g) {
    const Tensor fresh = raw::binary(raw::BinaryOp::mul, g[0], 2.0);
    return GradList{fresh, fresh};
  });
  cpf::backward(y, full({2}, 1.0, {.dtype = DType::f64}));
  EXPECT_NE(a.grad().raw_data(), b.grad().raw_data());
  raw::add_(a.grad(), a.grad());
  EXPECT_EQ(a.grad().to_vector<double>(), (std::vector<double>{4, 4}));
  EXPECT_EQ(b.grad().to_vector<double>(), (std::vector<double>{2, 2}));
}

TEST(AccumulateGrad, TheCallersSeedIsNotAdopted) {
  const Tensor x = leaf({1, 2});
  const Tensor seed = from_vector<double>({7, 8}, {2});
  cpf::backward(x, seed);  // x is its own root: the seed goes straight to its accumulator
  EXPECT_NE(x.grad().raw_data(), seed.raw_data());
  raw::add_(x.grad(), x.grad());
  EXPECT_EQ(seed.to_vector<double>(), (std::vector<double>{7, 8}));
}

TEST(AccumulateGrad, ABroadcastViewBecomesADenseCopy) {
  const Tensor x = leaf({1, 2, 3});
  run(x, [](const GradList&) { return GradList{raw::expand(full({1}, 2.0, {.dtype = DType::f64}), {3})}; });
  EXPECT_TRUE(x.grad().is_contiguous());
  EXPECT_EQ(x.grad().storage()->nbytes(), 3 * sizeof(double));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{2, 2, 2}));
}

TEST(AccumulateGrad, HooksSeeTheAdoptedGradient) {
  const Tensor x = leaf({1, 2});
  const void* produced = nullptr;
  std::vector<double> seen;
  const void* seen_data = nullptr;
  autograd::GradHookHandle h = autograd::add_grad_ready_hook(x, [&](const Tensor& l) {
    seen = l.grad().to_vector<double>();
    seen_data = l.grad().raw_data();
  });
  run(x, [&produced](const GradList& g) {
    Tensor fresh = raw::binary(raw::BinaryOp::mul, g[0], -1.0);
    produced = fresh.raw_data();
    return GradList{fresh};
  });
  EXPECT_EQ(seen, (std::vector<double>{-1, -1}));
  EXPECT_EQ(seen_data, produced);
}

}  // namespace
}  // namespace cpf
