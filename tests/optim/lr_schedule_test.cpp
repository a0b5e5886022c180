#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "framework/optim/lr_schedule.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

using optim::LrDecay;
using optim::LrSchedule;
using optim::LrScheduleOptions;

TEST(LrSchedule, CosineAtKeySteps) {
  LrSchedule s({.decay = LrDecay::cosine, .lr = 1.0, .min_lr = 0.1, .warmup_steps = 10, .total_steps = 110});
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.1);  // (0 + 1) / 10
  EXPECT_DOUBLE_EQ(s.lr_at(4), 0.5);
  EXPECT_DOUBLE_EQ(s.lr_at(9), 1.0);      // last warmup step reaches the peak
  EXPECT_DOUBLE_EQ(s.lr_at(10), 1.0);     // decay starts at progress 0
  EXPECT_NEAR(s.lr_at(60), 0.55, 1e-15);  // halfway: (peak + floor) / 2
  EXPECT_NEAR(s.lr_at(35), 0.1 + 0.45 * (1 + std::cos(std::numbers::pi * 0.25)), 1e-15);
  EXPECT_NEAR(s.lr_at(109), 0.1 + 0.45 * (1 + std::cos(std::numbers::pi * 0.99)), 1e-15);
  EXPECT_DOUBLE_EQ(s.lr_at(110), 0.1);   // end
  EXPECT_DOUBLE_EQ(s.lr_at(1000), 0.1);  // past the end
}

TEST(LrSchedule, LinearAtKeySteps) {
  LrSchedule s({.decay = LrDecay::linear, .lr = 2.0, .min_lr = 0.0, .warmup_steps = 4, .total_steps = 24});
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.5);
  EXPECT_DOUBLE_EQ(s.lr_at(3), 2.0);
  EXPECT_DOUBLE_EQ(s.lr_at(4), 2.0);
  EXPECT_DOUBLE_EQ(s.lr_at(14), 1.0);
  EXPECT_DOUBLE_EQ(s.lr_at(19), 0.5);
  EXPECT_DOUBLE_EQ(s.lr_at(24), 0.0);
  EXPECT_DOUBLE_EQ(s.lr_at(25), 0.0);
}

TEST(LrSchedule, ConstantWithAndWithoutWarmup) {
  LrSchedule warm({.decay = LrDecay::constant, .lr = 0.3, .warmup_steps = 3});
  EXPECT_DOUBLE_EQ(warm.lr_at(0), 0.1);
  EXPECT_DOUBLE_EQ(warm.lr_at(2), 0.3);
  EXPECT_DOUBLE_EQ(warm.lr_at(100000), 0.3);
  LrSchedule flat({.decay = LrDecay::constant, .lr = 0.3});
  EXPECT_DOUBLE_EQ(flat.lr_at(0), 0.3);
}

TEST(LrSchedule, NoWarmupAndWarmupEqualToTotal) {
  LrSchedule none({.decay = LrDecay::cosine, .lr = 1.0, .min_lr = 0.0, .warmup_steps = 0, .total_steps = 4});
  EXPECT_DOUBLE_EQ(none.lr_at(0), 1.0);
  EXPECT_NEAR(none.lr_at(2), 0.5, 1e-15);
  EXPECT_DOUBLE_EQ(none.lr_at(4), 0.0);
  LrSchedule all_warmup({.decay = LrDecay::linear, .lr = 1.0, .min_lr = 0.2, .warmup_steps = 5, .total_steps = 5});
  EXPECT_DOUBLE_EQ(all_warmup.lr_at(4), 1.0);
  EXPECT_DOUBLE_EQ(all_warmup.lr_at(5), 0.2);
}

TEST(LrSchedule, DecayNamesRoundTrip) {
  for (LrDecay d : {LrDecay::cosine, LrDecay::linear, LrDecay::constant}) {
    EXPECT_EQ(optim::lr_decay_from_name(optim::lr_decay_name(d)), d);
  }
  EXPECT_CPF_ERROR(optim::lr_decay_from_name("step"),
                   "lr_schedule: unknown decay 'step' (expected cosine, linear or constant)");
}

TEST(LrSchedule, RejectsInvalidOptions) {
  EXPECT_CPF_ERROR(LrSchedule({.lr = -1.0, .total_steps = 10}), "lr_schedule: lr must be finite and >= 0, got -1");
  EXPECT_CPF_ERROR(LrSchedule({.lr = NAN, .total_steps = 10}), "lr_schedule: lr must be finite and >= 0, got nan");
  EXPECT_CPF_ERROR(LrSchedule({.warmup_steps = -1, .total_steps = 10}),
                   "lr_schedule: warmup_steps must be >= 0, got -1");
  EXPECT_CPF_ERROR(LrSchedule({.lr = 1.0, .min_lr = -0.1, .total_steps = 10}),
                   "lr_schedule: min_lr must be finite and >= 0, got -0.1");
  EXPECT_CPF_ERROR(LrSchedule({.lr = 1.0, .min_lr = 2.0, .total_steps = 10}),
                   "lr_schedule: min_lr=2 must not exceed the peak lr=1");
  EXPECT_CPF_ERROR(LrSchedule({.decay = LrDecay::linear, .total_steps = 0}),
                   "lr_schedule: total_steps must be > 0 for linear decay, got 0");
  EXPECT_CPF_ERROR(LrSchedule({.warmup_steps = 11, .total_steps = 10}),
                   "lr_schedule: warmup_steps=11 must not exceed total_steps=10");
  LrSchedule s({.total_steps = 10});
  EXPECT_CPF_ERROR(s.lr_at(-1), "lr_schedule: step must be >= 0, got -1");
}

}  // namespace
}  // namespace cpf
