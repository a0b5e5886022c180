// Activation recomputation (framework/autograd/checkpoint.h, forward_stash.h) on the CPU: outputs and
// gradients equal the region run without recomputation bit for bit (both policies, inputs and captured
// parameters, undefined inputs, nesting), f64 gradchecks through the region, what each policy keeps
// from the first forward, and the refusals (a parameter changed before the backward, a recompute that
// runs other ops).
#include <gtest/gtest.h>

#include <memory>

#include "framework/autograd/checkpoint.h"
#include "framework/autograd/forward_stash.h"
#include "framework/autograd/grad_mode.h"
#include "framework/autograd/ops.h"
#include "framework/tensor/ops/elementwise.h"
#include "support/gradcheck_utils.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

using autograd::checkpoint;
using autograd::CheckpointOptions;
using autograd::RecomputePolicy;
using testing::all_close;
using testing::grad_input;
using Inputs = std::vector<Tensor>;

// A small block: x (N, 4) -> {x + W2 tanh(rms_norm(W1 x)), swiglu of the two halves of W1 x}.
struct Block {
  Tensor w1 = grad_input({8, 4}, 11), w2 = grad_input({4, 4}, 12), g = grad_input({8}, 13);
  Inputs params() const { return {w1, w2, g}; }
  Inputs operator()(const Inputs& in) const {
    const Tensor h = linear(in[0], w1);                           // (N, 8)
    const Tensor n = tanh(rms_norm(h, g));                        // (N, 8)
    const Tensor y = add(in[0], linear(narrow(n, 1, 0, 4), w2));  // (N, 4)
    const Tensor z = swiglu_packed(h);                            // (N, 4)
    return {y, in.size() > 1 && in[1].defined() ? add(z, in[1]) : z};
  }
};

Tensor loss_of(const Inputs& out) { return add(sum(mul(out[0], out[0])), sum(mul(out[1], 3.0))); }

struct RegionRun {
  Inputs out, grads;  // outputs; gradients of x, the side input and the block's parameters
};

RegionRun run(const Block& block, std::optional<RecomputePolicy> policy, bool side_input) {
  for (const Tensor& p : block.params()) p.set_grad(Tensor());
  Tensor x = grad_input({5, 4}, 1), side = side_input ? grad_input({5, 4}, 2) : Tensor();
  const Inputs in{x, side};
  RegionRun r;
  r.out = policy ? checkpoint(block, in, {.name = "block", .policy = *policy, .params = block.params()}) : block(in);
  backward(loss_of(r.out));
  r.grads = {x.grad(), side_input ? side.grad() : Tensor()};
  for (const Tensor& p : block.params()) r.grads.push_back(p.grad());
  return r;
}

void expect_bit_equal(const RegionRun& a, const RegionRun& b, const std::string& what) {
  for (size_t i = 0; i < a.out.size(); ++i) EXPECT_TRUE(all_close(a.out[i], b.out[i], 0, 0)) << what << " out " << i;
  for (size_t i = 0; i < a.grads.size(); ++i) {
    ASSERT_EQ(a.grads[i].defined(), b.grads[i].defined()) << what << " grad " << i;
    if (a.grads[i].defined()) EXPECT_TRUE(all_close(a.grads[i], b.grads[i], 0, 0)) << what << " grad " << i;
  }
}

TEST(Checkpoint, EqualsThePlainRegionBitForBit) {
  const Block block;
  for (bool side : {true, false}) {
    const RegionRun plain = run(block, std::nullopt, side);
    expect_bit_equal(run(block, RecomputePolicy::full, side), plain, "full");
    expect_bit_equal(run(block, RecomputePolicy::selective, side), plain, "selective");
  }
}

TEST(Checkpoint, GradcheckThroughTheRegion) {
  const Block block;
  for (RecomputePolicy policy : {RecomputePolicy::full, RecomputePolicy::selective}) {
    // The weights as region inputs (their gradients leave through the node's edges) ...
    EXPECT_GRADCHECK(
        [policy](const Inputs& in) {
          auto fn = [](const Inputs& r) { return Inputs{linear(tanh(linear(r[0], r[1])), r[2])}; };
          return checkpoint(fn, in, {.name = "mlp", .policy = policy, .params = {}});
        },
        (Inputs{grad_input({3, 4}, 1), grad_input({6, 4}, 2), grad_input({2, 6}, 3)}));
    // ... and captured as parameters (their gradients come from the nested backward).
    EXPECT_GRADCHECK(
        [&block, policy](const Inputs& in) {
          const Inputs out = checkpoint(block, in, {.name = "block", .policy = policy, .params = block.params()});
          return Inputs{out[0], out[1], add(sum(block.w1), sum(block.g))};
        },
        (Inputs{grad_input({3, 4}, 4), grad_input({3, 4}, 5)}));
  }
}

// Under `full` nothing of the region outlives the forward but its outputs; `selective` keeps the GEMM
// outputs (the stash) and still frees what the norm and the activations computed.
TEST(Checkpoint, WhatEachPolicyKeeps) {
  for (RecomputePolicy policy : {RecomputePolicy::full, RecomputePolicy::selective}) {
    std::weak_ptr<Storage> gemm, norm;
    bool first = true;
    const Tensor w = grad_input({8, 4}, 3), g = grad_input({8}, 4);
    auto fn = [&](const Inputs& in) {
      const Tensor h = linear(in[0], w);  // (N, 8)
      const Tensor n = rms_norm(h, g);    // (N, 8)
      if (first) {                        // the first forward's tensors only
        gemm = h.storage();
        norm = n.storage();
        first = false;
      }
      return Inputs{tanh(n)};
    };
    const Inputs out = checkpoint(fn, {grad_input({5, 4}, 1)}, {.name = "r", .policy = policy, .params = {w, g}});
    EXPECT_TRUE(norm.expired()) << "the norm's output is recomputed, never kept";
    EXPECT_EQ(!gemm.expired(), policy == RecomputePolicy::selective) << "the GEMM output is kept by selective only";
    backward(sum(out[0]));
    EXPECT_TRUE(gemm.expired()) << "taken from the stash and freed by the backward";
    EXPECT_TRUE(w.grad().defined() && g.grad().defined());
  }
}

TEST(Checkpoint, WithoutRecordingItIsTheRegion) {
  const Block block;
  NoGradGuard no_grad;
  const Tensor x = testing::random_tensor({5, 4});
  const Inputs out = checkpoint(block, {x, Tensor()}, {.name = "b", .policy = RecomputePolicy::full, .params = {}});
  EXPECT_FALSE(out[0].requires_grad());
  EXPECT_TRUE(all_close(out[0], block({x, Tensor()})[0], 0, 0));
}

TEST(Checkpoint, NestedRegionsEqualThePlainRun) {
  const Block block;
  const RegionRun plain = run(block, std::nullopt, true);
  for (const Tensor& p : block.params()) p.set_grad(Tensor());
  Tensor x = grad_input({5, 4}, 1), side = grad_input({5, 4}, 2);
  auto outer = [&block](const Inputs& in) {
    return checkpoint(block, in, {.name = "inner", .policy = RecomputePolicy::selective, .params = block.params()});
  };
  RegionRun nested;
  nested.out = checkpoint(outer, {x, side}, {.name = "outer", .policy = RecomputePolicy::full, .params = {}});
  backward(loss_of(nested.out));
  nested.grads = {x.grad(), side.grad()};
  for (const Tensor& p : block.params()) nested.grads.push_back(p.grad());
  expect_bit_equal(nested, plain, "nested");
}

TEST(Checkpoint, RefusesAParameterChangedBeforeTheBackward) {
  const Block block;
  const Inputs out = checkpoint(block, {grad_input({5, 4}, 1), Tensor()},
                                {.name = "blocks.0", .policy = RecomputePolicy::full, .params = block.params()});
  {
    NoGradGuard no_grad;
    raw::add_(block.w2, ones_like(block.w2.detach()));  // what an optimizer step would do
    block.w2.bump_version();
  }
  EXPECT_CPF_ERROR(backward(loss_of(out)), "saved for the backward of 'recompute[blocks.0]' was modified in place");
}

TEST(Checkpoint, RefusesARecomputeThatRunsOtherOps) {
  const Tensor w = grad_input({4, 4}, 3);
  int calls = 0;
  auto fn = [&](const Inputs& in) { return Inputs{++calls == 1 ? linear(in[0], w) : tanh(in[0])}; };
  const Inputs out =
      checkpoint(fn, {grad_input({2, 4}, 1)}, {.name = "odd", .policy = RecomputePolicy::selective, .params = {w}});
  EXPECT_CPF_ERROR(backward(sum(out[0])), "the recompute of 'odd' used 0 of the 1 ops its first forward kept");

  calls = 0;
  auto swapped = [&](const Inputs& in) { return Inputs{++calls == 1 ? linear(in[0], w) : linear_gelu(in[0], w)}; };
  const Inputs out2 = checkpoint(swapped, {grad_input({2, 4}, 1)},
                                 {.name = "odd", .policy = RecomputePolicy::selective, .params = {w}});
  EXPECT_CPF_ERROR(backward(sum(out2[0])), "op 0 of the region was 'linear' in the first forward but is 'linear_gelu'");
}

TEST(ForwardStash, RefusesValuesChangedInPlaceAndWrongPhases) {
  autograd::ForwardStash stash;
  const Tensor t = testing::random_tensor({3});
  EXPECT_CPF_ERROR(stash.take("linear"), "'linear' tried to take kept values outside a replay");
  stash.keep("linear", {t});
  EXPECT_EQ(stash.bytes(), 3 * sizeof(double));
  raw::add_(t, t);
  t.bump_version();
  stash.start_replay();
  EXPECT_CPF_ERROR(stash.keep("linear", {t}), "'linear' tried to keep values while the region replays");
  EXPECT_CPF_ERROR(stash.take("linear"), "output 0 of 'linear' (shape [3]) was modified in place after the first");
  autograd::ForwardStash used;
  used.keep("attention", {t});
  used.start_replay();
  EXPECT_EQ(used.take("attention").size(), 1u);
  EXPECT_EQ(used.bytes(), 0u);
  EXPECT_CPF_ERROR(used.take("linear"), "calls 'linear' after the 1 kept op(s) of its first forward ran out");
}

TEST(Checkpoint, RefusesAnEmptyRegion) {
  EXPECT_CPF_ERROR(
      checkpoint(autograd::RegionFn(), {}, {.name = "none", .policy = RecomputePolicy::full, .params = {}}),
      "checkpoint 'none': the region function is empty");
}

}  // namespace
}  // namespace cpf
