// Gradient-ready hooks (framework/autograd/grad_ready_hook.h): when they fire (once per backward,
// after every contribution, as soon as the leaf is complete), when they do not (leaf outside the
// graph, no grad mode, removed hooks), and the rejected inputs.
#include "framework/autograd/grad_ready_hook.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "framework/autograd/engine.h"
#include "framework/autograd/grad_mode.h"
#include "framework/autograd/node.h"
#include "framework/autograd/ops.h"
#include "framework/tensor/ops/elementwise.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

using testing::all_close;
using testing::grad_input;

Tensor leaf(const std::vector<double>& v) {
  Tensor t = from_vector<double>(v, {static_cast<int64_t>(v.size())});
  t.set_requires_grad(true);
  return t;
}

// Records what each firing saw: the leaf's gradient at that moment.
struct Recorder {
  std::vector<std::vector<double>> seen;
  autograd::GradReadyHook hook() {
    return [this](const Tensor& t) {
      seen.push_back(t.grad().defined() ? t.grad().to_vector<double>() : std::vector<double>{});
    };
  }
};

TEST(GradReadyHook, LeafUsedTwiceFiresOnceWithBothContributions) {
  Tensor w = leaf({1, 2, 3});
  Recorder rec;
  auto handle = autograd::add_grad_ready_hook(w, rec.hook());
  // Two paths into w, the second through a chain, so the first contribution arrives early.
  const Tensor a = from_vector<double>({2, 2, 2}, {3});
  Tensor chain = cpf::mul(w, 3.0);
  for (int i = 0; i < 5; ++i) chain = cpf::add(chain, 1.0);
  backward(cpf::add(cpf::sum(cpf::mul(w, a)), cpf::sum(chain)));
  ASSERT_EQ(rec.seen.size(), 1u) << "one firing per backward, however many paths lead to the leaf";
  EXPECT_EQ(rec.seen[0], (std::vector<double>{5, 5, 5})) << "fired before both contributions (2 + 3) were added";
  EXPECT_EQ(w.grad().to_vector<double>(), (std::vector<double>{5, 5, 5}));
}

TEST(GradReadyHook, TiedLeafAtBothEndsOfAChainFiresAtTheEnd) {
  // w is used first and last (like tied embeddings): its gradient is only final at the end.
  Tensor w = leaf({0.5, -1});
  Tensor x = cpf::mul(w, 2.0);
  for (int i = 0; i < 20; ++i) x = cpf::tanh(x);
  Recorder rec;
  auto handle = autograd::add_grad_ready_hook(w, rec.hook());  // registered after recording: still fires
  backward(cpf::sum(cpf::mul(x, w)));
  ASSERT_EQ(rec.seen.size(), 1u);
  EXPECT_EQ(rec.seen[0], w.grad().to_vector<double>());
}

TEST(GradReadyHook, FiresAsSoonAsTheLeafIsCompleteBeforeEarlierLayers) {
  // y = tanh(tanh(x * w1) * w2): w2's gradient is complete before w1's node runs. The hook is
  // registered before the forward, so w2's accumulator is older than every node of the graph; it
  // must still run before them.
  Tensor w1 = grad_input({4}, 1), w2 = grad_input({4}, 2);
  const Tensor x = testing::random_tensor({4}, DType::f64, 3);
  bool w1_had_grad_when_w2_fired = true;
  int fired = 0;
  auto h2 = autograd::add_grad_ready_hook(w2, [&](const Tensor& t) {
    ++fired;
    EXPECT_TRUE(t.grad().defined());
    w1_had_grad_when_w2_fired = w1.grad().defined();
  });
  backward(cpf::sum(cpf::tanh(cpf::mul(cpf::tanh(cpf::mul(x, w1)), w2))));
  EXPECT_EQ(fired, 1);
  EXPECT_FALSE(w1_had_grad_when_w2_fired) << "w2's hook waited for the rest of backward (no overlap possible)";
  EXPECT_TRUE(w1.grad().defined());
}

TEST(GradReadyHook, LeafOutsideTheGraphDoesNotFire) {
  Tensor used = leaf({1, 2}), unused = leaf({3, 4});
  Recorder rec_used, rec_unused;
  auto h1 = autograd::add_grad_ready_hook(used, rec_used.hook());
  auto h2 = autograd::add_grad_ready_hook(unused, rec_unused.hook());
  backward(cpf::sum(cpf::mul(used, 2.0)));
  EXPECT_EQ(rec_used.seen.size(), 1u);
  EXPECT_TRUE(rec_unused.seen.empty());
  // Detached: the computation does not reach the leaf either.
  backward(cpf::sum(cpf::mul(cpf::add(used, 0.0), unused.detach())));
  EXPECT_EQ(rec_used.seen.size(), 2u);
  EXPECT_TRUE(rec_unused.seen.empty());
}

TEST(GradReadyHook, LeafInTheGraphWithoutAGradientFiresWithItsGradUnchanged) {
  Tensor w = leaf({1, 2});
  Recorder rec;
  auto handle = autograd::add_grad_ready_hook(w, rec.hook());
  // An op whose backward gives w no gradient.
  auto no_grad_op = [](const Tensor& in) {
    return autograd::record("test::no_gradient", raw::mul(in.detach(), 1.0), {in},
                            [](const autograd::GradList&) { return autograd::GradList{Tensor()}; });
  };
  backward(cpf::sum(no_grad_op(w)));
  ASSERT_EQ(rec.seen.size(), 1u);
  EXPECT_TRUE(rec.seen[0].empty()) << "no gradient was ever set, so the hook sees an undefined grad";
  EXPECT_FALSE(w.grad().defined());
  w.set_grad(from_vector<double>({7, 8}, {2}));
  backward(cpf::sum(no_grad_op(w)));
  ASSERT_EQ(rec.seen.size(), 2u);
  EXPECT_EQ(rec.seen[1], (std::vector<double>{7, 8})) << "the existing gradient stays as it was";
}

TEST(GradReadyHook, FiresOncePerBackwardCallWithRetainGraph) {
  Tensor w = leaf({1, 2});
  Recorder rec;
  auto handle = autograd::add_grad_ready_hook(w, rec.hook());
  const Tensor loss = cpf::sum(cpf::mul(w, w));
  backward(loss, Tensor(), /*retain_graph=*/true);
  backward(loss);
  ASSERT_EQ(rec.seen.size(), 2u);
  EXPECT_EQ(rec.seen[0], (std::vector<double>{2, 4}));
  EXPECT_EQ(rec.seen[1], (std::vector<double>{4, 8})) << "the second call accumulates onto the first";
}

TEST(GradReadyHook, LeafAsTheRootFires) {
  Tensor w = leaf({1, 2});
  Recorder rec;
  auto handle = autograd::add_grad_ready_hook(w, rec.hook());
  backward(w, from_vector<double>({3, 4}, {2}));
  ASSERT_EQ(rec.seen.size(), 1u);
  EXPECT_EQ(rec.seen[0], (std::vector<double>{3, 4}));
}

TEST(GradReadyHook, NoGradModeRecordsNothingSoNothingFires) {
  Tensor w = leaf({1, 2});
  Recorder rec;
  auto handle = autograd::add_grad_ready_hook(w, rec.hook());
  Tensor y;
  {
    NoGradGuard guard;
    y = cpf::sum(cpf::mul(w, 2.0));
  }
  EXPECT_FALSE(y.requires_grad());
  EXPECT_CPF_ERROR(backward(y), "does not require grad");
  EXPECT_TRUE(rec.seen.empty());
}

TEST(GradReadyHook, SeveralHooksFireInRegistrationOrderAndRemovedHooksDoNot) {
  Tensor w = leaf({1});
  std::string order;
  auto a = autograd::add_grad_ready_hook(w, [&](const Tensor&) { order += "a"; });
  auto b = autograd::add_grad_ready_hook(w, [&](const Tensor&) { order += "b"; });
  auto c = autograd::add_grad_ready_hook(w, [&](const Tensor&) { order += "c"; });
  backward(cpf::sum(cpf::mul(w, 2.0)));
  EXPECT_EQ(order, "abc");

  b.remove();
  EXPECT_FALSE(b.active());
  b.remove();  // twice is harmless
  backward(cpf::sum(cpf::mul(w, 2.0)));
  EXPECT_EQ(order, "abcac");

  {
    auto moved = std::move(c);
    EXPECT_FALSE(c.active());
    EXPECT_TRUE(moved.active());
  }  // destroyed: removed
  backward(cpf::sum(cpf::mul(w, 2.0)));
  EXPECT_EQ(order, "abcaca");

  a = autograd::GradHookHandle();  // assigning over a handle removes its hook
  backward(cpf::sum(cpf::mul(w, 2.0)));
  EXPECT_EQ(order, "abcaca");
}

TEST(GradReadyHook, AHookMayRemoveItselfWhileFiring) {
  Tensor w = leaf({1});
  int fired = 0;
  autograd::GradHookHandle self;
  self = autograd::add_grad_ready_hook(w, [&](const Tensor&) {
    ++fired;
    self.remove();
  });
  backward(cpf::sum(cpf::mul(w, 2.0)));
  backward(cpf::sum(cpf::mul(w, 2.0)));
  EXPECT_EQ(fired, 1);
}

TEST(GradReadyHook, AnExceptionFromAHookLeavesBackward) {
  Tensor w = leaf({1});
  auto handle = autograd::add_grad_ready_hook(w, [](const Tensor&) { CPF_CHECK(false, "test hook: refused"); });
  EXPECT_CPF_ERROR(backward(cpf::sum(cpf::mul(w, 2.0))), "test hook: refused");
}

TEST(GradReadyHook, GradientsAreUnchangedByHooks) {
  // The same graph with and without hooks: the accumulators run earlier, the values stay the same.
  auto run = [](bool hooked) {
    Tensor w1 = grad_input({3, 3}, 5), w2 = grad_input({3, 3}, 6);
    std::vector<autograd::GradHookHandle> handles;
    if (hooked) {
      handles.push_back(autograd::add_grad_ready_hook(w1, [](const Tensor&) {}));
      handles.push_back(autograd::add_grad_ready_hook(w2, [](const Tensor&) {}));
    }
    const Tensor x = testing::random_tensor({2, 3}, DType::f64, 7);
    const Tensor h = cpf::tanh(cpf::matmul(x, w1));
    backward(cpf::sum(cpf::mul(cpf::matmul(h, w2), cpf::matmul(h, w1))));
    return std::vector<Tensor>{w1.grad(), w2.grad()};
  };
  const auto plain = run(false), hooked = run(true);
  EXPECT_TRUE(all_close(hooked[0], plain[0], 0, 0));
  EXPECT_TRUE(all_close(hooked[1], plain[1], 0, 0));
}

TEST(GradReadyHook, RejectsWhatBackwardNeverReaches) {
  EXPECT_CPF_ERROR((void)autograd::add_grad_ready_hook(Tensor(), [](const Tensor&) {}),
                   "add_grad_ready_hook: the tensor is undefined");
  Tensor w = leaf({1, 2});
  EXPECT_CPF_ERROR((void)autograd::add_grad_ready_hook(cpf::mul(w, 2.0), [](const Tensor&) {}),
                   "add_grad_ready_hook: the tensor of shape [2] is not a leaf (it was computed by 'mul')");
  EXPECT_CPF_ERROR((void)autograd::add_grad_ready_hook(from_vector<double>({1}, {1}), [](const Tensor&) {}),
                   "add_grad_ready_hook: the leaf of shape [1] does not require grad");
  EXPECT_CPF_ERROR((void)autograd::add_grad_ready_hook(w, autograd::GradReadyHook()),
                   "add_grad_ready_hook: the hook for the leaf of shape [2] is empty");
}

}  // namespace
}  // namespace cpf
