// The backward engine and graph recording: accumulation, retain_graph, freed graphs, seeds and roots,
// grad mode, in-place detection, deep graphs, shared inputs, detach, and gradients through views.
#include "framework/autograd/engine.h"

#include <gtest/gtest.h>

#include <thread>

#include "framework/autograd/node.h"
#include "framework/autograd/ops.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/views.h"
#include "support/test_device.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

using testing::all_close;
using testing::grad_input;

// f64 values on `device` (the CPU unless a device-parameterised test passes its own).
Tensor vec(const std::vector<double>& v, const Shape& shape, Device device = Device::cpu()) {
  return from_vector<double>(v, shape, device);
}
Tensor leaf(const std::vector<double>& v, const Shape& shape, Device device = Device::cpu()) {
  Tensor t = vec(v, shape, device);
  t.set_requires_grad(true);
  return t;
}
std::vector<double> grad_of(const Tensor& t) {
  EXPECT_TRUE(t.grad().defined());
  return t.grad().defined() ? t.grad().to_vector<double>() : std::vector<double>{};
}

// Accumulation and view gradients run on every device of support/test_device.h: the gradients live
// and accumulate on the leaf's device.
class EngineOnDevice : public testing::DeviceTest {};
class ViewGradients : public testing::DeviceTest {};

// ---- accumulation and graph lifetime ----

TEST_P(EngineOnDevice, GradientsAccumulateAcrossBackwardCalls) {
  Tensor x = leaf({1, 2, 3}, {3}, device());
  backward(sum(mul(x, x)));  // d/dx = 2x
  EXPECT_EQ(grad_of(x), (std::vector<double>{2, 4, 6}));
  backward(sum(mul(x, 3.0)));  // a new graph: += 3
  EXPECT_EQ(grad_of(x), (std::vector<double>{5, 7, 9}));
  // The accumulated gradient is updated in place: a handle taken earlier sees the sum.
  Tensor g = x.grad();
  backward(sum(x));
  EXPECT_EQ(g.to_vector<double>(), (std::vector<double>{6, 8, 10}));
  x.set_grad(Tensor());
  backward(sum(x));
  EXPECT_EQ(grad_of(x), (std::vector<double>{1, 1, 1}));
}

TEST_P(EngineOnDevice, RetainGraphAllowsASecondBackward) {
  Tensor x = leaf({1, -2}, {2}, device());
  Tensor y = sum(mul(exp(x), x));  // d/dx = exp(x) (1 + x)
  backward(y, Tensor(), /*retain_graph=*/true);
  const auto once = grad_of(x);
  EXPECT_NEAR(once[0], std::exp(1.0) * 2, 1e-12);
  EXPECT_NEAR(once[1], std::exp(-2.0) * -1, 1e-12);
  backward(y);
  const auto twice = grad_of(x);
  EXPECT_NEAR(twice[0], 2 * once[0], 1e-12);
  EXPECT_NEAR(twice[1], 2 * once[1], 1e-12);
}

TEST(Engine, SecondBackwardThroughAFreedGraphThrows) {
  Tensor x = leaf({1, 2}, {2});
  Tensor y = sum(mul(x, x));
  backward(y);
  EXPECT_CPF_ERROR(backward(y), "a second time");
  EXPECT_CPF_ERROR(backward(y), "pass retain_graph=true to the first backward call");
  EXPECT_CPF_ERROR(backward(y), "trying to backward through the graph of 'sum'");
}

TEST(Engine, BackwardFreesSavedTensors) {
  Tensor x = leaf({1, 2}, {2});
  Tensor y = mul(x, x);  // saves two aliases of x
  const long before = x.storage().use_count();
  Tensor loss = sum(y);
  backward(loss, Tensor(), /*retain_graph=*/true);
  EXPECT_EQ(x.storage().use_count(), before) << "retain_graph keeps the saved tensors";
  backward(loss);
  EXPECT_LT(x.storage().use_count(), before) << "the saved aliases of x were released";
}

// ---- roots and seeds ----

TEST(Engine, RootErrors) {
  Tensor plain = vec({1, 2}, {2});
  EXPECT_CPF_ERROR(backward(plain), "backward: the tensor of shape [2] does not require grad");
  EXPECT_CPF_ERROR(backward(sum(plain)), "does not require grad (no input of its computation requires grad");
  EXPECT_CPF_ERROR(backward(Tensor()), "backward: root 0 is an undefined tensor");
  Tensor x = leaf({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor y = mul(x, 2.0);
  EXPECT_CPF_ERROR(backward(y),
                   "backward: a gradient can only be implied for a scalar output; the root has shape "
                   "[2,3], pass grad explicitly");
  EXPECT_CPF_ERROR(backward(y, ones({3}, {.dtype = DType::f64})),
                   "backward: gradient of shape [3] for a root of shape [2,3]");
  EXPECT_CPF_ERROR(backward(y, ones({2, 3})), "backward: gradient dtype f32 differs from root dtype f64");
  EXPECT_CPF_ERROR(backward({y, y}, {ones({2, 3}, {.dtype = DType::f64})}), "backward: 1 gradients given for 2 roots");
  EXPECT_FALSE(x.grad().defined()) << "nothing ran";
}

TEST(Engine, ExplicitSeedsAndOneElementRoots) {
  Tensor x = leaf({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor g = vec({1, 0, -1, 2, 0.5, 3}, {2, 3});
  backward(mul(x, 2.0), g);
  EXPECT_EQ(grad_of(x), (std::vector<double>{2, 0, -2, 4, 1, 6}));
  // The stored gradient is a private copy, not an alias of the seed.
  raw::fill_(g, 100.0);
  EXPECT_EQ(grad_of(x), (std::vector<double>{2, 0, -2, 4, 1, 6}));
  // A one-element root of any rank is seeded with 1.
  Tensor s = leaf({3}, {1, 1});
  backward(mul(s, s));
  EXPECT_EQ(grad_of(s), (std::vector<double>{6}));
  // A leaf can be a root itself.
  Tensor l = leaf({7}, {});
  backward(l);
  EXPECT_EQ(grad_of(l), (std::vector<double>{1}));
}

TEST(Engine, MultipleRoots) {
  Tensor x = leaf({1, 2}, {2});
  Tensor a = sum(mul(x, x));     // 2x
  Tensor b = sum(mul(x, 10.0));  // 10
  backward({a, b});
  EXPECT_EQ(grad_of(x), (std::vector<double>{12, 14}));
  // Roots where one is computed from the other: both seeds flow (y seeded 1, z = 3y seeded 2).
  Tensor w = leaf({2}, {});
  Tensor y = mul(w, w);
  Tensor z = mul(y, 3.0);
  backward({z, y}, {scalar_tensor(2.0, {.dtype = DType::f64}), scalar_tensor(1.0, {.dtype = DType::f64})});
  EXPECT_EQ(grad_of(w), (std::vector<double>{(2 * 3 + 1) * 2 * 2}));
  // The same tensor twice: seeds add.
  Tensor v = leaf({1}, {});
  Tensor u = mul(v, 5.0);
  backward({u, u});
  EXPECT_EQ(grad_of(v), (std::vector<double>{10}));
}

TEST(Engine, SharedInputsSumTheirGradients) {
  Tensor x = leaf({0.5, -1}, {2});
  backward(sum(add(mul(x, x), exp(x))));  // diamond: 2x + exp(x)
  const auto g = grad_of(x);
  EXPECT_NEAR(g[0], 1 + std::exp(0.5), 1e-12);
  EXPECT_NEAR(g[1], -2 + std::exp(-1.0), 1e-12);
  Tensor a = leaf({3}, {});
  backward(add(a, a));
  EXPECT_EQ(grad_of(a), (std::vector<double>{2}));
  // A wide diamond: one node feeding 50 branches that join again.
  Tensor w = leaf({1, 2, 3}, {3});
  Tensor h = mul(w, 2.0);
  Tensor acc = mul(h, 0.0);
  for (int i = 1; i <= 50; ++i) acc = add(acc, mul(h, static_cast<double>(i)));
  backward(sum(acc));
  EXPECT_EQ(grad_of(w), std::vector<double>(3, 2.0 * 50 * 51 / 2));
}

TEST(Engine, OnlyInputsThatRequireGradGetOne) {
  Tensor x = leaf({1, 2}, {2});
  Tensor c = vec({3, 4}, {2});
  backward(sum(mul(x, c)));
  EXPECT_EQ(grad_of(x), (std::vector<double>{3, 4}));
  EXPECT_FALSE(c.grad().defined());
  Tensor i = argmax(mul(x, c), 0);
  EXPECT_EQ(i.dtype(), DType::i64);
  EXPECT_FALSE(i.requires_grad()) << "integer outputs are never part of the graph";
}

// ---- grad mode ----

TEST(GradMode, NoGradGuardDisablesRecording) {
  Tensor x = leaf({1, 2}, {2});
  EXPECT_TRUE(grad_enabled());
  {
    NoGradGuard guard;
    EXPECT_FALSE(grad_enabled());
    Tensor y = mul(x, x);
    EXPECT_FALSE(y.requires_grad());
    EXPECT_TRUE(y.is_leaf());
    {
      NoGradGuard nested;
      EXPECT_FALSE(grad_enabled());
    }
    EXPECT_FALSE(grad_enabled()) << "the inner guard restores the outer state";
    EXPECT_CPF_ERROR(backward(sum(y)), "does not require grad");
  }
  EXPECT_TRUE(grad_enabled());
  Tensor z = mul(x, x);
  EXPECT_TRUE(z.requires_grad());
  EXPECT_FALSE(z.is_leaf());
  EXPECT_EQ(z.grad_fn()->name(), "mul");
}

TEST(GradMode, IsPerThread) {
  Tensor x = leaf({1}, {1});
  NoGradGuard guard;
  bool other_thread_records = false;
  std::thread t([&] { other_thread_records = grad_enabled() && mul(x, x).requires_grad(); });
  t.join();
  EXPECT_TRUE(other_thread_records);
  EXPECT_FALSE(mul(x, x).requires_grad());
}

TEST(GradMode, SetRequiresGradOnNonLeaves) {
  Tensor x = leaf({1}, {1});
  Tensor y = mul(x, 2.0);
  EXPECT_CPF_ERROR(y.set_requires_grad(false),
                   "set_requires_grad(false) on a non-leaf tensor of shape [1]: use detach() to take it out of "
                   "the graph");
  y.set_requires_grad(true);  // already true: harmless
  EXPECT_TRUE(y.requires_grad());
}

// ---- in-place safety ----

TEST(InPlace, ModifyingASavedTensorIsDetected) {
  Tensor a = leaf({1, 2}, {2});
  Tensor b = leaf({3, 4}, {2});
  Tensor y = sum(mul(a, b));
  raw::add_(a, ones({2}, {.dtype = DType::f64}));  // raw ops do not guard: bumps the version mul saved
  try {
    backward(y);
    FAIL() << "the in-place change was not detected";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("a tensor of shape [2] saved for the backward of 'mul' was modified in place"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("(version 1, saved at version 0)"), std::string::npos) << what;
  }
  EXPECT_FALSE(b.grad().defined());
  EXPECT_FALSE(a.grad().defined());
  EXPECT_TRUE(grad_enabled()) << "the engine's NoGradGuard is undone by the exception";
  EXPECT_EQ(autograd::current_backward_op(), "");
  // A graph recorded after the change saves the new version and runs.
  backward(sum(mul(a, b)));
  EXPECT_EQ(grad_of(b), (std::vector<double>{2, 3}));
}

TEST(InPlace, ModifyingAnOutputSavedByItsOpIsDetected) {
  Tensor x = leaf({0.5}, {1});
  Tensor y = exp(x);  // exp saves its output
  Tensor loss = sum(y);
  raw::mul_(y.detach(), 2.0);
  EXPECT_CPF_ERROR(backward(loss), "saved for the backward of 'exp' was modified in place after it was saved");
}

TEST(InPlace, WritesThroughAnotherViewAreDetected) {
  // square saves a view of x; the write goes through a different view of the same storage. The
  // version is per storage, so even a write outside the saved range counts (conservative).
  Tensor x = leaf({1, 2, 3, 4}, {4});
  Tensor loss = sum(mul(narrow(x, 0, 0, 2), 3.0));     // mul by a scalar saves nothing
  Tensor view_loss = sum(square(narrow(x, 0, 2, 2)));  // square saves its input: a view of x
  raw::fill_(raw::narrow(x.detach(), 0, 0, 1), 10.0);  // touches x's storage (not even the saved range)
  backward(loss);                                      // nothing saved: runs
  EXPECT_EQ(grad_of(x), (std::vector<double>{3, 3, 0, 0}));
  EXPECT_CPF_ERROR(backward(view_loss), "saved for the backward of 'square' was modified in place");
}

TEST(InPlace, UnsavedTensorsMayChange) {
  Tensor x = leaf({1, 2}, {2});
  Tensor c = vec({5, 5}, {2});
  Tensor y = sum(add(x, c));  // add saves nothing
  raw::add_(c, ones({2}, {.dtype = DType::f64}));
  backward(y);
  EXPECT_EQ(grad_of(x), (std::vector<double>{1, 1}));
}

TEST(InPlace, DifferentiableInPlaceOpsRefuseTensorsThatRequireGrad) {
  Tensor w = leaf({1, 2, 3}, {3});
  Tensor d = vec({1, 1, 1}, {3});
  EXPECT_CPF_ERROR(add_(w, d), "add_: in-place update of a tensor of shape [3] that requires grad");
  EXPECT_CPF_ERROR(mul_(w, 2.0), "mul_: in-place update of a tensor of shape [3] that requires grad");
  EXPECT_CPF_ERROR(fill_(w, 0.0), "fill_: in-place update");
  EXPECT_CPF_ERROR(zero_(w), "fill_: in-place update");
  EXPECT_CPF_ERROR(copy_(w, d), "copy_: in-place update");
  EXPECT_EQ(w.to_vector<double>(), (std::vector<double>{1, 2, 3})) << "refused before writing";
  {
    NoGradGuard guard;  // a parameter update
    add_(w, d, -0.5);
    mul_(w, 2.0);
  }
  EXPECT_EQ(w.to_vector<double>(), (std::vector<double>{1, 3, 5}));
  add_(d, d);  // tensors outside the graph are fine
  EXPECT_EQ(d.to_vector<double>(), (std::vector<double>{2, 2, 2}));
  copy_(d, w);
  zero_(d);
  EXPECT_EQ(d.to_vector<double>(), (std::vector<double>{0, 0, 0}));
}

// ---- deep and custom graphs ----

TEST(Engine, DeepChainDoesNotOverflowTheStack) {
  constexpr int depth = 200000;
  Tensor x = leaf({1.0}, {});
  Tensor y = x;
  for (int i = 0; i < depth / 2; ++i) y = add(mul(y, 1.00001), 0.5);
  backward(y);
  EXPECT_NEAR(grad_of(x)[0], std::pow(1.00001, depth / 2), 1e-9);
  // Dropping the graph (here without a backward, so every node is still intact) must not recurse.
  Tensor z = x;
  for (int i = 0; i < depth; ++i) z = mul(z, 1.0);
  z = Tensor();
  SUCCEED();
}

TEST(Engine, CustomNodesAreCheckedByTheEngine) {
  Tensor x = leaf({1, 2}, {2});
  auto record_with = [&](autograd::BackwardFn fn) {
    return autograd::record("bad", raw::mul(x, 2.0), {x}, std::move(fn));
  };
  EXPECT_CPF_ERROR(backward(sum(record_with([](const autograd::GradList&) {
                     return autograd::GradList{zeros({3}, {.dtype = DType::f64})};
                   }))),
                   "autograd: backward of 'bad' returned a gradient of shape [3] for input 0 of shape [2]");
  EXPECT_CPF_ERROR(backward(sum(record_with([](const autograd::GradList&) { return autograd::GradList{zeros({2})}; }))),
                   "autograd: backward of 'bad' returned a f32 gradient for input 0 of dtype f64");
  EXPECT_CPF_ERROR(backward(sum(record_with([](const autograd::GradList& g) {
                     return autograd::GradList{g[0], g[0]};
                   }))),
                   "autograd: backward of 'bad' returned 2 gradients for 1 inputs");
  // An undefined gradient means "none": the leaf is left alone.
  backward(sum(record_with([](const autograd::GradList&) { return autograd::GradList{Tensor()}; })));
  EXPECT_FALSE(x.grad().defined());
  // The op name is visible to the backward function while it runs, and cleared after.
  std::string seen;
  backward(sum(record_with([&seen](const autograd::GradList& g) {
    seen = autograd::current_backward_op();
    return autograd::GradList{raw::mul(g[0], 2.0)};
  })));
  EXPECT_EQ(seen, "bad");
  EXPECT_EQ(autograd::current_backward_op(), "");
  EXPECT_EQ(grad_of(x), (std::vector<double>{2, 2}));
}

TEST(Engine, MultiOutputNodes) {
  // One node with two outputs; only the second receives a gradient.
  Tensor x = leaf({1, 2}, {2});
  std::vector<Tensor> outs =
      autograd::record("split", {raw::mul(x, 2.0), raw::mul(x, 3.0)}, {x}, [](const autograd::GradList& g) {
        EXPECT_FALSE(g[0].defined());
        return autograd::GradList{raw::mul(g[1], 3.0)};
      });
  ASSERT_EQ(outs.size(), 2u);
  EXPECT_EQ(outs[0].grad_fn(), outs[1].grad_fn());
  EXPECT_EQ(outs[1].output_nr(), 1u);
  backward(sum(outs[1]));
  EXPECT_EQ(grad_of(x), (std::vector<double>{3, 3}));
}

// A source node (what dist::recv records): no inputs, its backward receives the output's gradient.
TEST(Engine, SourceNodesReceiveTheirOutputsGradient) {
  std::vector<double> received;
  Tensor y = autograd::record_source("source", vec({1, 2}, {2}), [&received](const autograd::GradList& g) {
    received = g[0].to_vector<double>();
    return autograd::GradList{};
  });
  EXPECT_TRUE(y.requires_grad());
  ASSERT_NE(y.grad_fn(), nullptr);
  EXPECT_EQ(y.grad_fn()->name(), "source");
  EXPECT_TRUE(y.grad_fn()->next_edges().empty());
  EXPECT_EQ(y.output_nr(), 0u);
  backward(sum(mul(y, 3.0)));
  EXPECT_EQ(received, (std::vector<double>{3, 3}));
  EXPECT_CPF_ERROR(autograd::record_source("ids", zeros({2}, {.dtype = DType::i64}), nullptr),
                   "autograd::record_source(ids): the output must be a defined floating tensor, got i64");
  EXPECT_CPF_ERROR(autograd::record_source("none", Tensor(), nullptr), "got an undefined tensor");
}

// ---- detach ----

TEST(Engine, DetachCutsTheGraph) {
  Tensor x = leaf({2, 3}, {2});
  Tensor c = x.detach();
  EXPECT_FALSE(c.requires_grad());
  EXPECT_EQ(c.storage(), x.storage());
  backward(sum(mul(c, x)));  // c is a constant: d/dx = c
  EXPECT_EQ(grad_of(x), (std::vector<double>{2, 3}));
  Tensor y = mul(x, x);
  Tensor yd = y.detach();
  EXPECT_TRUE(yd.is_leaf());
  EXPECT_FALSE(yd.requires_grad());
  EXPECT_CPF_ERROR(backward(sum(mul(yd, 2.0))), "does not require grad");
}

// ---- gradients through views ----

TEST_P(ViewGradients, EachViewScattersBack) {
  Tensor x = leaf({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {3, 4}, device());
  auto grad_of_sum = [&](const Tensor& view, const Tensor& weights) {
    x.set_grad(Tensor());
    backward(sum(mul(view, weights)));
    return grad_of(x);
  };
  // narrow: columns 1..2 get their weights, the rest 0.
  EXPECT_EQ(grad_of_sum(narrow(x, 1, 1, 2), vec({1, 2, 3, 4, 5, 6}, {3, 2}, device())),
            (std::vector<double>{0, 1, 2, 0, 0, 3, 4, 0, 0, 5, 6, 0}));
  // select: row -1.
  EXPECT_EQ(grad_of_sum(select(x, 0, -1), vec({1, 2, 3, 4}, {4}, device())),
            (std::vector<double>{0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4}));
  // slice with a step: columns 0 and 2.
  EXPECT_EQ(grad_of_sum(slice(x, 1, 0, 4, 2), vec({1, 2, 3, 4, 5, 6}, {3, 2}, device())),
            (std::vector<double>{1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0}));
  // permute / transpose: the weight at [j][i] lands on [i][j].
  EXPECT_EQ(grad_of_sum(permute(x, {1, 0}), vec({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {4, 3}, device())),
            (std::vector<double>{1, 4, 7, 10, 2, 5, 8, 11, 3, 6, 9, 12}));
  EXPECT_EQ(grad_of_sum(transpose(x, 0, 1), vec({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {4, 3}, device())),
            (std::vector<double>{1, 4, 7, 10, 2, 5, 8, 11, 3, 6, 9, 12}));
  // expand: broadcast copies sum back.
  Tensor row = leaf({1, 2, 3}, {1, 3}, device());
  backward(sum(mul(expand(row, {4, 3}), vec({1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4}, {4, 3}, device()))));
  EXPECT_EQ(grad_of(row), (std::vector<double>{10, 10, 10}));
  Tensor s = leaf({2}, {}, device());
  backward(sum(expand(s, {2, 5})));
  EXPECT_EQ(grad_of(s), (std::vector<double>{10}));
}

TEST_P(ViewGradients, OverlappingViewsAccumulate) {
  Tensor x = leaf({1, 2, 3, 4}, {4}, device());
  // Two overlapping windows and a select of the same leaf.
  Tensor loss = add(add(sum(narrow(x, 0, 0, 3)), sum(mul(narrow(x, 0, 1, 3), 2.0))), mul(select(x, 0, 2), 10.0));
  backward(loss);
  EXPECT_EQ(grad_of(x), (std::vector<double>{1, 3, 13, 2}));
  // Views of views of a non-contiguous view.
  Tensor m = leaf({0, 1, 2, 3, 4, 5}, {2, 3}, device());
  backward(sum(mul(select(narrow(transpose(m, 0, 1), 0, 1, 2), 1, 0), vec({5, 7}, {2}, device()))));
  EXPECT_EQ(grad_of(m), (std::vector<double>{0, 5, 7, 0, 0, 0}));
}

TEST_P(ViewGradients, ReshapesAndConversions) {
  Tensor x = grad_leaf({2, 3}, 3);
  Tensor w = constant({3, 2}, 4);
  backward(sum(mul(reshape(x, {3, 2}), w)));
  EXPECT_TRUE(all_close(x.grad(), raw::reshape(w, {2, 3}), 0, 0));
  x.set_grad(Tensor());
  backward(sum(mul(view(flatten(unsqueeze(x, 0)), {3, 2}), w)));
  EXPECT_TRUE(all_close(x.grad(), raw::reshape(w, {2, 3}), 0, 0));
  x.set_grad(Tensor());
  Tensor f = to(x, DType::f32);  // gradient converted back to f64
  EXPECT_EQ(f.dtype(), DType::f32);
  backward(sum(mul(f, 2.0)));
  EXPECT_EQ(x.grad().dtype(), DType::f64);
  EXPECT_EQ(x.grad().device(), device());
  EXPECT_EQ(x.grad().to_vector<double>(), std::vector<double>(6, 2.0));
  EXPECT_TRUE(to(x, DType::f64).is_same(x));
  EXPECT_TRUE(contiguous(x).is_same(x));
}

CPF_INSTANTIATE_DEVICE_SUITE(EngineOnDevice);
CPF_INSTANTIATE_DEVICE_SUITE(ViewGradients);

}  // namespace
}  // namespace cpf
