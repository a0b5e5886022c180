// The per-step bf16 copies of f32 parameters (framework/nn/compute_copies.h) and the multi-tensor cast
// they use (framework/tensor/ops/cast_many.h): copies are learned from the lookups that missed, made in
// one refresh, reused while the parameter's version holds and remade after an in-place update; a layer
// using them computes bit for bit what it computes casting per use, and its gradient still reaches the
// f32 master parameter.
#include "framework/nn/compute_copies.h"

#include <gtest/gtest.h>

#include "framework/autograd/ops.h"
#include "framework/nn/linear.h"
#include "framework/nn/precision.h"
#include "framework/tensor/ops/cast_many.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/join.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

using testing::random_tensor;

::testing::AssertionResult equal(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype()) return ::testing::AssertionFailure() << a.dtype() << " vs " << b.dtype();
  return testing::all_close(a, b, 0.0, 0.0);
}

Tensor bf16_input(const Shape& shape, uint64_t seed) {
  return raw::to(random_tensor(shape, DType::f32, seed), DType::bf16);
}

TEST(ComputeCopies, LearnsWhatIsUsedAndRecastsOnlyChangedParameters) {
  nn::Linear a({.in_features = 6, .out_features = 5}), b({.in_features = 5, .out_features = 3, .bias = false});
  const std::vector<Tensor> params = {a.weight(), a.bias(), b.weight()};
  nn::ComputeCopies copies;
  copies.refresh(params, DType::bf16);
  EXPECT_EQ(copies.conversions(), 0);  // nothing looked up yet
  const Tensor x = bf16_input({4, 6}, 1);
  {
    const nn::ComputeCopiesScope scope(&copies);
    b.forward(a.forward(x));  // both weights missed: now wanted
  }
  copies.refresh(params, DType::bf16);
  EXPECT_EQ(copies.conversions(), 3);  // the two weights and a's bias (Linear reads its bias through the cache too)
  const Tensor wa = copies.find(a.weight(), DType::bf16);
  ASSERT_TRUE(wa.defined());
  EXPECT_TRUE(equal(wa, raw::to(a.weight(), DType::bf16)));
  EXPECT_FALSE(copies.find(a.weight(), DType::f64).defined());
  copies.refresh(params, DType::bf16);  // unchanged: kept, not recast
  EXPECT_EQ(copies.conversions(), 3);
  EXPECT_TRUE(copies.find(a.weight(), DType::bf16).is_same(wa));
  {
    NoGradGuard guard;  // an optimizer-style in-place update bumps the version
    raw::copy_(a.weight(), random_tensor({5, 6}, DType::f32, 2));
  }
  EXPECT_FALSE(copies.find(a.weight(), DType::bf16).defined());  // stale copies are never handed out
  copies.refresh(params, DType::bf16);
  EXPECT_EQ(copies.conversions(), 4);
  EXPECT_TRUE(equal(copies.find(a.weight(), DType::bf16), raw::to(a.weight(), DType::bf16)));
  EXPECT_FALSE(wa.is_same(copies.find(a.weight(), DType::bf16)));  // a new tensor: saved graphs keep the old
  copies.refresh({a.weight()}, DType::bf16);                       // b no longer listed: its copy is dropped
  EXPECT_FALSE(copies.find(b.weight(), DType::bf16).defined());
}

TEST(ComputeCopies, LayersComputeTheSameWithCopiesAndGradientsReachTheMaster) {
  nn::Linear lin({.in_features = 8, .out_features = 4});
  const Tensor w = lin.weight();
  const Tensor x = bf16_input({3, 8}, 3);
  const auto run = [&](const nn::ComputeCopies* copies) {
    const nn::ComputeCopiesScope scope(copies);
    w.set_grad(Tensor());
    Tensor y = lin.forward(x);  // (3, 4) bf16
    Tensor p = nn::compute_parameter(w, DType::bf16, "test", "weight");
    backward(add(sum(to(y, DType::f32)), sum(mul(to(p, DType::f32), to(p, DType::f32)))));
    return std::pair{y, w.grad()};
  };
  const auto [y0, g0] = run(nullptr);
  nn::ComputeCopies copies;
  run(&copies);  // learns
  copies.refresh({w}, DType::bf16);
  ASSERT_TRUE(copies.find(w, DType::bf16).defined());
  const auto [y1, g1] = run(&copies);
  EXPECT_EQ(copies.conversions(), 1);
  EXPECT_TRUE(equal(y1, y0));
  ASSERT_TRUE(g1.defined());
  EXPECT_EQ(g1.dtype(), DType::f32);
  EXPECT_TRUE(equal(g1, g0));
  // compute_parameter hands out a differentiable alias of the copy, not the cached tensor itself.
  const nn::ComputeCopiesScope scope(&copies);
  const Tensor p = nn::compute_parameter(w, DType::bf16, "test", "weight");
  EXPECT_TRUE(p.requires_grad());
  EXPECT_FALSE(p.is_same(copies.find(w, DType::bf16)));
  EXPECT_FALSE(copies.find(w, DType::bf16).requires_grad());
}

// find_stacked: the concatenation of the parts' copies, made once every part has a copy, kept (the same
// tensor) while they are unchanged, dropped by the refresh after an update and made anew.
TEST(ComputeCopies, KeepsTheConcatenationOfUnchangedCopies) {
  nn::Linear q({.in_features = 6, .out_features = 4}), k({.in_features = 6, .out_features = 2});
  const std::vector<Tensor> params = {q.weight(), k.weight()};
  nn::ComputeCopies copies;
  EXPECT_FALSE(copies.find_stacked(params, DType::bf16).defined());  // no copies yet: both now wanted
  copies.refresh(params, DType::bf16);
  const Tensor stacked = copies.find_stacked(params, DType::bf16);
  ASSERT_TRUE(stacked.defined());
  EXPECT_TRUE(equal(stacked, raw::cat({raw::to(q.weight(), DType::bf16), raw::to(k.weight(), DType::bf16)}, 0)));
  EXPECT_TRUE(copies.find_stacked(params, DType::bf16).is_same(stacked));
  copies.refresh(params, DType::bf16);
  EXPECT_TRUE(copies.find_stacked(params, DType::bf16).is_same(stacked));
  EXPECT_EQ(copies.stackings(), 1);
  {
    NoGradGuard guard;
    raw::copy_(k.weight(), random_tensor({2, 6}, DType::f32, 3));
  }
  EXPECT_FALSE(copies.find_stacked(params, DType::bf16).defined());  // k's copy is stale
  copies.refresh(params, DType::bf16);
  const Tensor again = copies.find_stacked(params, DType::bf16);
  EXPECT_FALSE(again.is_same(stacked));  // a new tensor: graphs that saved the old one keep it
  EXPECT_TRUE(equal(again, raw::cat({raw::to(q.weight(), DType::bf16), raw::to(k.weight(), DType::bf16)}, 0)));
  EXPECT_EQ(copies.stackings(), 2);
  // Under a scope, linear_cat's few-row inputs without gradients get them (the biases' too, once they have
  // copies); 128 rows and more build their own per call.
  const nn::ComputeCopiesScope scope(&copies);
  const Tensor x = bf16_input({2, 6}, 4);
  {
    const std::vector<LinearWeights> training = {q.weights_for(x), k.weights_for(x)};
    EXPECT_FALSE(nn::active_stacked_copies(x, training).weight.defined());  // with gradients: the parts apart
  }
  NoGradGuard decoding;
  std::vector<LinearWeights> parts = {q.weights_for(x), k.weights_for(x)};  // the biases' lookups miss
  EXPECT_FALSE(nn::active_stacked_copies(x, parts).weight.defined());
  copies.refresh({q.weight(), k.weight(), q.bias(), k.bias()}, DType::bf16);
  parts = {q.weights_for(x), k.weights_for(x)};
  const LinearCatStacked kept = nn::active_stacked_copies(x, parts);
  EXPECT_TRUE(kept.weight.is_same(again));
  EXPECT_TRUE(equal(kept.bias, raw::cat({raw::to(q.bias(), DType::bf16), raw::to(k.bias(), DType::bf16)}, 0)));
  EXPECT_FALSE(nn::active_stacked_copies(bf16_input({128, 6}, 4), parts).weight.defined());
}

TEST(ComputeCopies, RejectsANonFloatingComputeDtype) {
  nn::ComputeCopies copies;
  EXPECT_CPF_ERROR(copies.refresh({ones({2})}, DType::i32),
                   "ComputeCopies: the compute dtype must be floating, got i32");
}

TEST(ToMany, EqualsToPerTensorAndRejectsBadLists) {
  const Tensor a = random_tensor({3, 5}, DType::f32, 4), b = random_tensor({7}, DType::f64, 5);
  const Tensor bf = raw::to(a, DType::bf16);
  const std::vector<Tensor> out = raw::to_many({a, b, bf}, DType::bf16);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_TRUE(equal(out[0], bf));
  EXPECT_TRUE(equal(out[1], raw::to(b, DType::bf16)));
  EXPECT_TRUE(out[2].is_same(bf));  // already bf16: itself
  EXPECT_TRUE(raw::to_many({}, DType::bf16).empty());
  EXPECT_CPF_ERROR(raw::to_many({a, Tensor()}, DType::bf16), "to_many: tensor 1 of 2 is undefined");
  EXPECT_CPF_ERROR(raw::to_many({ones({2}, {.dtype = DType::i64})}, DType::bf16),
                   "to_many: tensor 0 is i64; only floating tensors are converted");
  EXPECT_CPF_ERROR(raw::to_many({a}, DType::i32),
                   "to_many: the target dtype must be floating (f32, f64 or bf16), got i32");
}

}  // namespace
}  // namespace cpf
