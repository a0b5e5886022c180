// Delayed scaling (framework/autograd/fp8_scaling.h) on the CPU: the state's slots, fp8_linear casting
// with a slot's scales and recording its amaxes, the autocast's stable keys (also for a recomputed
// block), and the exact text round trip checkpoints carry; bad options and bad text are refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "framework/autograd/fp8_autocast.h"
#include "framework/autograd/fp8_scaling.h"
#include "framework/autograd/functions/fp8_linear.h"
#include "framework/autograd/functions/linear.h"
#include "framework/autograd/grad_mode.h"
#include "framework/autograd/ops.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/fp8.h"
#include "framework/tensor/ops/matmul.h"
#include "framework/tensor/ops/views.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

using testing::all_close;
using testing::random_tensor;

constexpr Fp8ScalingOptions kDelayed{.recipe = Fp8Recipe::delayed, .margin = 0, .amax_history = 3};

float value(const Tensor& t) { return raw::to(t, DType::f32).item<float>(); }

// t's values after an FP8 round trip with the given scale, in f64.
Tensor through_fp8(const Tensor& t, const Tensor& scale, DType fp8) {
  const Tensor q = raw::quantize_fp8(t, scale, fp8);
  return raw::to(raw::dequantize_fp8(q, raw::unary(raw::UnaryOp::reciprocal, scale), DType::f32), DType::f64);
}

TEST(Fp8Scaling, SlotsAreStableViewsFreshUntilTheFirstUpdate) {
  Fp8ScalingState state(kDelayed, Device::cpu());
  const Fp8Slot a = state.slot("blocks.0.fp8_0");
  EXPECT_TRUE(a.fresh);
  raw::fill_(a.amax[0], 5.0);
  EXPECT_EQ(value(state.slot("blocks.0.fp8_0").amax[0]), 5.0f);  // the same values under the same key
  state.slot("blocks.0.fp8_1");
  EXPECT_EQ(state.keys(), (std::vector<std::string>{"blocks.0.fp8_0", "blocks.0.fp8_1"}));
  state.update();
  const Fp8Slot settled = state.slot("blocks.0.fp8_0");
  EXPECT_FALSE(settled.fresh);
  EXPECT_EQ(value(settled.scale[0]), 448.0f / 5.0f);
  EXPECT_EQ(value(settled.amax[0]), 0.0f);          // cleared for the next step
  EXPECT_EQ(value(settled.scale[1]), 1.0f);         // nothing recorded: the initial scale stays
  EXPECT_TRUE(state.slot("blocks.1.fp8_0").fresh);  // made after the update
  const double fingerprint = state.keys_fingerprint();
  Fp8ScalingState reordered(kDelayed, Device::cpu());
  reordered.slot("blocks.1.fp8_0");
  reordered.slot("blocks.0.fp8_1");
  reordered.slot("blocks.0.fp8_0");
  EXPECT_NE(reordered.keys_fingerprint(), fingerprint);  // the same keys in another order
  EXPECT_LT(fingerprint, 4503599627370496.0);            // 52 bits: exact in an f64 all-reduce
  for (int i = 0; i < 70; ++i) state.slot("extra." + std::to_string(i));
  EXPECT_EQ(state.amax_buffers().size(), 2u);  // 64 slots a buffer
  EXPECT_EQ(state.amax_buffers()[0].shape(), (Shape{192}));
}

// A settled slot: the forward casts x and W with the slot's scales (not their own amaxes), the backward
// casts dY with its gradient scale, and each cast folds its tensor's amax into the slot.
TEST(Fp8Scaling, Fp8LinearCastsWithTheSlotsScalesAndRecordsItsAmaxes) {
  Fp8ScalingState state(kDelayed, Device::cpu());
  state.slot("l");
  state.update();
  const Fp8Slot slot = state.slot("l");
  raw::fill_(slot.scale[0], 64.0);   // x: |x| < 1 uses a quarter of E4M3's range
  raw::fill_(slot.scale[1], 512.0);  // W: |W| < 0.2 would saturate at |W| > 0.875 (none)
  raw::fill_(slot.scale[2], 4096.0);
  const Tensor x = raw::to(random_tensor({16, 32}, DType::f32, 1), DType::bf16);
  Tensor w = random_tensor({16, 32}, DType::f32, 2, -0.2, 0.2).set_requires_grad(true);
  Tensor xg = raw::clone(x).set_requires_grad(true);
  const Tensor y = fp8_linear(xg, w, Tensor(), {.slot = slot});
  const Tensor gy = raw::to(random_tensor({16, 16}, DType::f32, 3), DType::bf16);
  backward(y, gy);

  const Tensor xq = through_fp8(x, slot.scale[0], DType::f8e4m3), wq = through_fp8(w, slot.scale[1], DType::f8e4m3);
  const Tensor gq = through_fp8(gy, slot.scale[2], DType::f8e5m2);
  EXPECT_TRUE(all_close(y, raw::matmul(xq, raw::transpose(wq, 0, 1)), 1e-2, 1.0 / 128));
  EXPECT_TRUE(all_close(w.grad(), raw::matmul(raw::transpose(gq, 0, 1), xq), 1e-5, 1e-5));
  EXPECT_TRUE(all_close(xg.grad(), raw::matmul(gq, wq), 1e-2, 1.0 / 128));
  EXPECT_EQ(value(slot.amax[0]), value(raw::abs_max(x)));
  EXPECT_EQ(value(slot.amax[1]), value(raw::abs_max(w)));
  EXPECT_EQ(value(slot.amax[2]), value(raw::abs_max(gy)));
  // Current scaling casts x by its own amax: another result.
  EXPECT_FALSE(all_close(fp8_linear(x, w), y, 0, 0));
}

// fp8_linear_after under delayed scaling: the input amax the slot records is that of the activation's
// output h (what was cast), not of its input pre; the casts use the slot's scale for h, and the fresh slot
// keeps the scale of h's own amax.
TEST(Fp8Scaling, LinearAfterAnActivationRecordsTheActivationsAmax) {
  for (raw::CastActivation act : {raw::CastActivation::gelu, raw::CastActivation::swiglu}) {
    Fp8ScalingState state(kDelayed, Device::cpu());
    const int64_t k = 32, width = act == raw::CastActivation::swiglu ? 2 * k : k;
    const Tensor pre = raw::to(random_tensor({16, width}, DType::f32, 4, -3, 1), DType::bf16);  // |pre| peaks below 0
    const Tensor w = random_tensor({16, k}, DType::f32, 5, -0.2, 0.2);
    const Tensor h = raw::apply_cast_activation(pre, act);  // (16, 32)
    const Tensor y = fp8_linear_after(act, pre, w, Tensor(), {.slot = state.slot("l")});
    EXPECT_EQ(value(state.slot("l").amax[0]), value(raw::abs_max(h))) << raw::cast_activation_name(act);
    EXPECT_NE(value(state.slot("l").amax[0]), value(raw::abs_max(pre))) << raw::cast_activation_name(act);
    EXPECT_EQ(value(state.slot("l").scale[0]), value(raw::fp8_scale(raw::abs_max(h), DType::f8e4m3)));
    state.update();
    const Fp8Slot settled = state.slot("l");
    ASSERT_FALSE(settled.fresh);
    raw::fill_(settled.scale[0], 16.0);  // a scale of the slot's own, not h's: the cast must use it
    const Tensor y_settled = fp8_linear_after(act, pre, w, Tensor(), {.slot = settled});
    EXPECT_TRUE(all_close(y_settled, fp8_linear(h, w, Tensor(), {.slot = settled}), 0, 0));
    EXPECT_FALSE(all_close(y_settled, y, 0, 0));
  }
}

// A fresh slot casts with current scaling and keeps those scales: when the step is skipped (no amax reaches
// the history) the next step casts with them, not with the initial 1.
TEST(Fp8Scaling, AFreshSlotKeepsTheScalesItCastWith) {
  Fp8ScalingState state(kDelayed, Device::cpu());
  const Tensor x = raw::to(random_tensor({16, 32}, DType::f32, 1, -0.01, 0.01), DType::bf16);  // small values
  Tensor w = random_tensor({16, 32}, DType::f32, 2, -0.2, 0.2).set_requires_grad(true);
  const Tensor first = fp8_linear(x, w, Tensor(), {.slot = state.slot("l")});
  EXPECT_EQ(value(state.slot("l").scale[0]), value(raw::fp8_scale(raw::abs_max(x), DType::f8e4m3)));
  state.update(full({1}, std::numeric_limits<double>::quiet_NaN(), {.dtype = DType::f64}));  // a skipped step
  const Fp8Slot settled = state.slot("l");
  ASSERT_FALSE(settled.fresh);
  EXPECT_TRUE(all_close(fp8_linear(x, w, Tensor(), {.slot = settled}), first, 0, 0));
  EXPECT_TRUE(all_close(fp8_linear(x, w), first, 0, 0));  // what current scaling computes
}

// Under an autocast with a state the k-th FP8 linear of the scope takes "<prefix>.fp8_<k>"; a second scope
// with the same prefix (a recomputed block) counts from 0 again; without gradients nothing is recorded.
TEST(Fp8Scaling, AutocastKeysCallSitesByScopeAndOrder) {
  Fp8ScalingState state(kDelayed, Device::cpu());
  const Tensor x = raw::to(random_tensor({16, 32}, DType::f32, 1), DType::bf16);
  const Tensor w1 = random_tensor({48, 32}, DType::f32, 2), w2 = random_tensor({32, 48}, DType::f32, 3);
  Tensor first;
  {
    const Fp8Autocast fp8(true, {}, &state, "blocks.2");
    first = gelu_mlp(x, {w1, {}, {}, {}}, {w2, {}, {}, {}});
  }
  EXPECT_EQ(state.keys(), (std::vector<std::string>{"blocks.2.fp8_0", "blocks.2.fp8_1"}));
  EXPECT_EQ(value(state.slot("blocks.2.fp8_1").amax[1]), value(raw::abs_max(w2)));
  {
    const Fp8Autocast again(true, {}, &state, "blocks.2");
    EXPECT_TRUE(all_close(gelu_mlp(x, {w1, {}, {}, {}}, {w2, {}, {}, {}}), first, 0, 0));  // fresh: current scaling
  }
  EXPECT_EQ(state.keys().size(), 2u);
  state.update();
  {
    const NoGradGuard no_grad;
    const Fp8Autocast eval(true, {}, &state, "blocks.2");
    linear(raw::mul(x, 4.0), w1);
  }
  EXPECT_EQ(value(state.slot("blocks.2.fp8_0").amax[0]), 0.0f);  // an evaluation records nothing
}

// The words of the line of serialize()'s text that starts with `key`.
std::vector<std::string> words_of(const std::string& text, const std::string& key) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(key + " ", 0) != 0) continue;
    std::istringstream in(line);
    std::vector<std::string> words;
    for (std::string w; in >> w;) words.push_back(w);
    return words;
  }
  return {};
}

TEST(Fp8Scaling, SerializeRestoreIsExact) {
  Fp8ScalingState state(kDelayed, Device::cpu());
  for (int step = 0; step < 4; ++step) {
    for (int s = 0; s < 3; ++s) {
      const Fp8Slot slot = state.slot("blocks." + std::to_string(s) + ".fp8_0");
      for (int role = 0; role < 3; ++role) raw::fill_(slot.amax[role], 0.1 + 0.37 * step + s + 0.01 * role);
    }
    state.update();
  }
  const std::string text = state.serialize();
  Fp8ScalingState restored(kDelayed, Device::cpu());
  restored.restore(text);
  EXPECT_EQ(restored.serialize(), text);
  EXPECT_EQ(restored.keys(), state.keys());
  EXPECT_FALSE(restored.slot("blocks.1.fp8_0").fresh);
  EXPECT_EQ(value(restored.slot("blocks.1.fp8_0").scale[2]), value(state.slot("blocks.1.fp8_0").scale[2]));

  // A shorter history keeps each scale and the newest amax of each history.
  Fp8ScalingState shorter({.recipe = Fp8Recipe::delayed, .amax_history = 1}, Device::cpu());
  shorter.restore(text);
  const std::vector<std::string> full_words = words_of(text, "blocks.1.fp8_0");
  ASSERT_EQ(full_words.size(), 14u);  // key, status, then 3 x (scale, 3 amaxes)
  EXPECT_EQ(full_words[1], "settled");
  EXPECT_EQ(words_of(shorter.serialize(), "blocks.1.fp8_0"),
            (std::vector<std::string>{full_words[0], full_words[1], full_words[2], full_words[3], full_words[6],
                                      full_words[7], full_words[10], full_words[11]}));
}

TEST(Fp8Scaling, RefusesBadOptionsAndBadText) {
  EXPECT_CPF_ERROR(Fp8ScalingState({.margin = 65}, Device::cpu()), "fp8: margin must be in [0, 64], got 65");
  EXPECT_CPF_ERROR(Fp8ScalingState({.amax_history = 0}, Device::cpu()),
                   "fp8: amax_history must be in [1, 4096], got 0");
  EXPECT_CPF_ERROR(Fp8ScalingState({.amax_history = 4097}, Device::cpu()),
                   "amax_history must be in [1, 4096], got 4097");
  Fp8ScalingState used(kDelayed, Device::cpu());
  used.slot("a");
  EXPECT_CPF_ERROR(used.restore(used.serialize()), "the state already has 1 slots");
  const auto restore = [](const std::string& text) {
    Fp8ScalingState state(kDelayed, Device::cpu());
    try {
      state.restore(text);
    } catch (...) {
      EXPECT_TRUE(state.keys().empty()) << "a refused text left slots behind";
      throw;
    }
  };
  const std::string head = "fp8_scaling_v1 slots=2 history=1\n";
  const std::string a = "a settled 3f800000 00000000 3f800000 00000000 3f800000 00000000\n";
  const std::string b = "b settled 3f800000 00000000 3f800000 00000000 3f800000 00000000\n";
  EXPECT_CPF_ERROR(restore("fp8_scaling_v2 slots=1 history=1\n"), "the text starts with 'fp8_scaling_v2");
  EXPECT_CPF_ERROR(restore(head + "a settled 3f800000 0 3f800000 0 3f800000 0\n" + b),
                   "slot 'a' holds '0' where an 8-digit hex float was expected");
  EXPECT_CPF_ERROR(restore(head + a), "2 slots announced, 1 found");
  EXPECT_CPF_ERROR(restore(head + a + a), "slot 1 has the repeated key 'a'");
  EXPECT_CPF_ERROR(restore(head + "a 3f800000\n" + b), "does not start with '<key> settled|fresh'");
  EXPECT_CPF_ERROR(restore(head + "a fresh 3f800000 00000000 3f800000 00000000 3f800000 00000000\n" + b),
                   "slot 'b' is settled but follows a fresh one");
  EXPECT_CPF_ERROR(restore(head + "a settled 7fc00000 00000000 3f800000 00000000 3f800000 00000000\n" + b),
                   "slot 'a' has the scale nan (scales are finite and > 0)");
  EXPECT_CPF_ERROR(restore(head + "a settled 3f800000 bf800000 3f800000 00000000 3f800000 00000000\n" + b),
                   "slot 'a' has the amax -1 (amaxes are finite and >= 0)");
  EXPECT_CPF_ERROR(restore(head + "a settled 3f800000 00000000 3f800000 00000000 3f800000 00000000 3f800000\n" + b),
                   "slot 'a' has more than 3 x (1 + 1) values (the extra '3f800000')");
  EXPECT_CPF_ERROR(restore(head + a + b + "c\n"), "a line after the 2 slots: 'c'");
  // A fresh slot stays fresh through the round trip: its next cast uses current scaling.
  Fp8ScalingState round(kDelayed, Device::cpu());
  round.restore(head + a + "b fresh 3f800000 00000000 3f800000 00000000 3f800000 00000000\n");
  EXPECT_FALSE(round.slot("a").fresh);
  EXPECT_TRUE(round.slot("b").fresh);
}

}  // namespace
}  // namespace cpf
