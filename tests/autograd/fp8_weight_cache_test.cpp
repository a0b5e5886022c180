// The FP8 weight copies a training step keeps (framework/autograd/fp8_weight_cache.h) on the CPU: inside
// an open step the first cast of a weight serves every later call, with the values and gradients of
// casting at every call bit for bit; a weight changed in place, another scale source, or a call that must
// record the weight's amax where the kept cast did not (or into another slot), or a view of another shape
// at the same address, casts again; linear_cat's parts share one copy and
// each gets its rows of dW; closing the step drops every copy, and nothing is kept outside one.
#include <gtest/gtest.h>

#include <vector>

#include "framework/autograd/fp8_scaling.h"
#include "framework/autograd/fp8_weight_cache.h"
#include "framework/autograd/functions/fp8_linear.h"
#include "framework/autograd/grad_mode.h"
#include "framework/autograd/ops.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/join.h"
#include "framework/tensor/ops/views.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

using testing::all_close;
using testing::random_tensor;

Tensor input(uint64_t seed) { return raw::to(random_tensor({16, 32}, DType::f32, seed), DType::bf16); }  // (M, K)

Tensor weight(int64_t rows, uint64_t seed) {  // (N, K) f32 master
  Tensor w = random_tensor({rows, 32}, DType::f32, seed);
  w.set_requires_grad(true);
  return w;
}

// Two calls of one weight in a step (a block and its recompute), then their backward: the outputs and
// the weight's gradient.
struct TwoCalls {
  Tensor y1, y2, dw;
};
TwoCalls two_calls(const Tensor& w, const Fp8LinearOptions& options) {
  const Tensor y1 = fp8_linear(input(1), w, Tensor(), options);
  const Tensor y2 = fp8_linear(input(2), w, Tensor(), options);
  backward(add(sum(to(y1, DType::f32)), sum(to(y2, DType::f32))));
  TwoCalls out{y1, y2, w.grad()};
  w.set_grad(Tensor());
  return out;
}

TEST(Fp8WeightCache, AStepCastsEachWeightOnceWithTheValuesOfCastingAtEveryCall) {
  const Tensor w = weight(48, 3);
  const TwoCalls plain = two_calls(w, {});
  Fp8WeightCache cache;
  TwoCalls kept;
  {
    const Fp8WeightCache::StepScope step(&cache);
    EXPECT_TRUE(cache.step_open());
    kept = two_calls(w, {.weight_cache = &cache});
    EXPECT_EQ(cache.size(), 1);
  }
  EXPECT_EQ(cache.stored(), 1) << "one cast for both calls";
  EXPECT_EQ(cache.reused(), 1);
  EXPECT_TRUE(all_close(kept.y1, plain.y1, 0, 0));
  EXPECT_TRUE(all_close(kept.y2, plain.y2, 0, 0));
  EXPECT_TRUE(all_close(kept.dw, plain.dw, 0, 0));
  // Closed: nothing held, and calls outside a step keep nothing.
  EXPECT_FALSE(cache.step_open());
  EXPECT_EQ(cache.size(), 0);
  two_calls(w, {.weight_cache = &cache});
  EXPECT_EQ(cache.stored(), 1);
  EXPECT_EQ(cache.reused(), 1);
  const Fp8WeightCache::StepScope none(nullptr);  // a null scope does nothing
}

TEST(Fp8WeightCache, AWeightChangedInPlaceIsCastAgain) {
  const Tensor w = weight(32, 4);
  Fp8WeightCache cache;
  const Fp8WeightCache::StepScope step(&cache);
  const Tensor before = fp8_linear(input(1), w, Tensor(), {.weight_cache = &cache});
  {
    const NoGradGuard no_grad;
    raw::copy_(w, raw::mul(w, 3.0));  // bumps the version, as the optimizer does
  }
  const Tensor after = fp8_linear(input(1), w, Tensor(), {.weight_cache = &cache});
  EXPECT_EQ(cache.stored(), 2);
  EXPECT_EQ(cache.reused(), 0);
  EXPECT_TRUE(all_close(after, fp8_linear(input(1), w, Tensor(), {}), 0, 0));
  EXPECT_FALSE(all_close(after, before, 0.5, 0.5)) << "the stale copy was used";
}

// linear_cat's form: the parts go in as they are, share one copy of their concatenation, and each gets
// its rows of dW; equal to the FP8 linear of the concatenated weight.
TEST(Fp8WeightCache, PartsShareOneCopyAndGetTheirRowsOfTheGradient) {
  const Tensor q = weight(32, 5), k = weight(16, 6);
  Tensor bias = random_tensor({48}, DType::f32, 7);
  bias.set_requires_grad(true);
  const Tensor whole = fp8_linear(input(1), cat({q, k}, 0), bias, {});
  backward(sum(to(whole, DType::f32)));
  const Tensor dq = q.grad(), dk = k.grad(), dbias = bias.grad();
  for (const Tensor& t : {q, k, bias}) t.set_grad(Tensor());
  Fp8WeightCache cache;
  const Fp8WeightCache::StepScope step(&cache);
  for (int call = 0; call < 2; ++call) {
    const Tensor y = fp8_linear(input(1), std::vector<Tensor>{q, k}, bias, {.weight_cache = &cache});
    EXPECT_TRUE(all_close(y, whole, 0, 0)) << call;
    backward(sum(to(y, DType::f32)));
    EXPECT_TRUE(all_close(q.grad(), dq, 0, 0)) << call;
    EXPECT_TRUE(all_close(k.grad(), dk, 0, 0)) << call;
    EXPECT_TRUE(all_close(bias.grad(), dbias, 0, 0)) << call;
    for (const Tensor& t : {q, k, bias}) t.set_grad(Tensor());
  }
  EXPECT_EQ(cache.stored(), 1);
  EXPECT_EQ(cache.reused(), 1);
  EXPECT_CPF_ERROR(fp8_linear(input(1), std::vector<Tensor>{q, random_tensor({16, 8}, DType::f32, 8)}, Tensor(), {}),
                   "fp8_linear: the weight's parts must be 2-D of one width, dtype and device, got [16,8] f32");
}

// Delayed scaling: a cast that did not record the weight's amax (an evaluation's) serves no training
// call, which must record it; a settled slot casts with its own scale, so a copy cast by the weight's
// own amax (a fresh slot's) is not taken for it.
TEST(Fp8WeightCache, DelayedScalingReusesOnlyACastThatRecordedTheAmaxWithTheSameScale) {
  const Tensor w = weight(32, 9);
  Fp8ScalingState state({.recipe = Fp8Recipe::delayed, .amax_history = 2}, Device::cpu());
  Fp8WeightCache cache;
  const Fp8WeightCache::StepScope step(&cache);
  Fp8Slot evaluation = state.slot("site");
  evaluation.amax = {};  // what the autocast gives a call without gradients
  fp8_linear(input(1), w, Tensor(), {.slot = evaluation, .weight_cache = &cache});
  EXPECT_EQ(cache.stored(), 1);
  const Fp8Slot training = state.slot("site");
  const auto weight_amax = [&] {
    return raw::to(training.amax[static_cast<size_t>(Fp8Role::weight)], DType::f32).item<float>();
  };
  EXPECT_EQ(weight_amax(), 0.0f);
  fp8_linear(input(1), w, Tensor(), {.slot = training, .weight_cache = &cache});
  EXPECT_EQ(cache.stored(), 2) << "the evaluation's copy recorded no amax";
  EXPECT_GT(weight_amax(), 0.0f);
  fp8_linear(input(2), w, Tensor(), {.slot = training, .weight_cache = &cache});
  EXPECT_EQ(cache.reused(), 1);
  state.update();  // settled: the slot's scale from now on
  const Fp8Slot settled = state.slot("site");
  ASSERT_FALSE(settled.fresh);
  const Tensor y = fp8_linear(input(1), w, Tensor(), {.slot = settled, .weight_cache = &cache});
  EXPECT_EQ(cache.stored(), 3) << "a copy cast by the weight's own amax served the slot's scale";
  EXPECT_EQ(cache.reused(), 1);
  EXPECT_TRUE(all_close(y, fp8_linear(input(1), w, Tensor(), {.slot = settled}), 0, 0));
}

// One weight at two call sites (two slots): the second site's cast records its own amax and writes its own
// scale, so it does not take the first site's copy; nor does a narrower view that starts at the same address.
TEST(Fp8WeightCache, AnotherSlotOrAnotherViewCastsAgain) {
  const Tensor w = weight(32, 10);
  Fp8ScalingState state({.recipe = Fp8Recipe::delayed, .amax_history = 2}, Device::cpu());
  Fp8WeightCache cache;
  const Fp8WeightCache::StepScope step(&cache);
  const Fp8Slot a = state.slot("a"), b = state.slot("b");
  fp8_linear(input(1), w, Tensor(), {.slot = a, .weight_cache = &cache});
  fp8_linear(input(1), w, Tensor(), {.slot = b, .weight_cache = &cache});
  EXPECT_EQ(cache.stored(), 2);
  EXPECT_EQ(cache.reused(), 0);
  const auto weight_amax = [](const Fp8Slot& s) {
    return raw::to(s.amax[static_cast<size_t>(Fp8Role::weight)], DType::f32).item<float>();
  };
  EXPECT_GT(weight_amax(b), 0.0f) << "the second site's weight amax was never recorded";
  EXPECT_EQ(weight_amax(a), weight_amax(b));
  const Tensor top = raw::narrow(w.detach(), 0, 0, 16);  // (16, 32) at w's address
  const Tensor y = fp8_linear(input(1), top, Tensor(), {.weight_cache = &cache});
  fp8_linear(input(1), w, Tensor(), {.weight_cache = &cache});
  EXPECT_EQ(y.shape(), (Shape{16, 16}));
  EXPECT_TRUE(all_close(y, fp8_linear(input(1), top, Tensor(), {}), 0, 0));
  EXPECT_EQ(cache.stored(), 4) << "the view and the whole weight share an address, not a copy";
}

// One training step's forward of two weights, the second given as linear_cat's parts, after the optimizer
// changed them in place (as a step does): the outputs.
std::vector<Tensor> step_forward(const std::vector<Tensor>& weights, const std::vector<Tensor>& parts,
                                 const Fp8LinearOptions& options, double change) {
  {
    const NoGradGuard no_grad;
    for (const Tensor& w : weights) raw::copy_(w, raw::mul(w, change));
    for (const Tensor& w : parts) raw::copy_(w, raw::mul(w, change));
  }
  std::vector<Tensor> out;
  for (const Tensor& w : weights) out.push_back(fp8_linear(input(1), w, Tensor(), options));
  if (!parts.empty()) out.push_back(fp8_linear(input(2), parts, Tensor(), options));
  return out;
}

// From the second step on, the first lookup casts every weight the previous step used (fp8_rows.h) and
// every call takes its copy, with the values of casting at the call.
TEST(Fp8WeightCache, LaterStepsCastEveryUsedWeightInOneRefresh) {
  const Tensor w = weight(32, 11), q = weight(32, 12), k = weight(16, 13);
  Fp8WeightCache cache;
  for (int step = 0; step < 3; ++step) {
    std::vector<Tensor> kept;
    {
      const Fp8WeightCache::StepScope scope(&cache);
      kept = step_forward({w}, {q, k}, {.margin = 1, .weight_cache = &cache}, 1.5);
    }
    const std::vector<Tensor> plain = step_forward({w}, {q, k}, {.margin = 1}, 1.0);
    for (size_t i = 0; i < kept.size(); ++i) EXPECT_TRUE(all_close(kept[i], plain[i], 0, 0)) << step << " " << i;
    EXPECT_EQ(cache.planned(), 2);
    EXPECT_EQ(cache.refreshed(), 2 * step) << "one refresh of both weights a step after the first";
    EXPECT_EQ(cache.stored(), 2 + 2 * step) << "the refreshed copies served every call";
    EXPECT_EQ(cache.reused(), 2 * step);
  }
  // A step that casts nothing (an evaluation outside the FP8 blocks) keeps the plan.
  { const Fp8WeightCache::StepScope scope(&cache); }
  EXPECT_EQ(cache.planned(), 2);
  // A step that uses one weight plans only that one.
  {
    const Fp8WeightCache::StepScope scope(&cache);
    step_forward({w}, {}, {.margin = 1, .weight_cache = &cache}, 1.0);
  }
  EXPECT_EQ(cache.planned(), 1);
}

// Delayed scaling: the refresh casts with the slot's scale (settled since the step that used it) and
// records the weight's amax into the slot, as the call would; a slot still fresh (no update between the
// steps) makes the call cast for itself.
TEST(Fp8WeightCache, RefreshCastsWithTheSettledSlotAndRecordsTheAmax) {
  const Tensor w = weight(32, 14);
  Fp8ScalingState state({.recipe = Fp8Recipe::delayed, .amax_history = 2}, Device::cpu());
  Fp8WeightCache cache;
  const auto weight_amax = [&] {
    return raw::to(state.slot("site").amax[static_cast<size_t>(Fp8Role::weight)], DType::f32).item<float>();
  };
  {
    const Fp8WeightCache::StepScope scope(&cache);
    step_forward({w}, {}, {.slot = state.slot("site"), .weight_cache = &cache}, 1.0);
  }
  {  // no update: the slot is still fresh, so the refreshed copy (cast as settled) is not taken
    const Fp8WeightCache::StepScope scope(&cache);
    const Fp8Slot fresh = state.slot("site");
    ASSERT_TRUE(fresh.fresh);
    const Tensor y = step_forward({w}, {}, {.slot = fresh, .weight_cache = &cache}, 1.0)[0];
    EXPECT_EQ(cache.refreshed(), 1);
    EXPECT_EQ(cache.stored(), 3) << "the fresh slot's call cast for itself";
    EXPECT_TRUE(all_close(y, fp8_linear(input(1), w, Tensor(), {.slot = state.slot("site")}), 0, 0));
  }
  state.update();
  const Fp8Slot settled = state.slot("site");
  ASSERT_FALSE(settled.fresh);
  EXPECT_EQ(weight_amax(), 0.0f);
  const Fp8WeightCache::StepScope scope(&cache);
  const Tensor y = step_forward({w}, {}, {.slot = settled, .weight_cache = &cache}, 2.0)[0];
  EXPECT_EQ(cache.refreshed(), 2);
  EXPECT_EQ(cache.stored(), 4) << "the settled slot's call took the refreshed copy";
  EXPECT_EQ(weight_amax(), raw::abs_max(w).item<float>());
  Fp8Slot unrecorded = settled;
  unrecorded.amax = {};
  EXPECT_TRUE(all_close(y, fp8_linear(input(1), w, Tensor(), {.slot = unrecorded}), 0, 0));
}

}  // namespace
}  // namespace cpf
