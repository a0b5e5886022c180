// raw::fp8_update_scales (framework/tensor/ops/fp8_scale_update.h) on the CPU, the reference of the CUDA
// kernel: histories roll newest-first, scales follow the history's max (or newest) with the margin, a
// zero history keeps the scale, a non-finite amax or a skipped step is dropped, and bad arguments are
// refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/fp8_scale_update.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

struct State {
  Tensor history, amax, scale, fp8_max;
};

// entries x length, with the given history rows, amaxes and scales; E4M3 maxima.
State make(const std::vector<float>& history, const std::vector<float>& amax, const std::vector<float>& scale) {
  const auto entries = static_cast<int64_t>(amax.size());
  const auto length = static_cast<int64_t>(history.size()) / entries;
  return {from_vector(history, {entries, length}), from_vector(amax, {entries}), from_vector(scale, {entries}),
          from_vector(std::vector<float>(entries, 448.0f), {entries})};
}

TEST(Fp8UpdateScales, RollsTheHistoryAndScalesByItsMax) {
  State s = make({2, 1, 0, /**/ 0, 0, 0}, {4, 0.5f}, {7, 9});
  raw::fp8_update_scales(s.history, s.amax, s.scale, s.fp8_max, 0, raw::AmaxCompute::max);
  EXPECT_EQ(s.history.to_vector<float>(), (std::vector<float>{4, 2, 1, 0.5f, 0, 0}));
  EXPECT_EQ(s.amax.to_vector<float>(), (std::vector<float>{0, 0}));
  EXPECT_EQ(s.scale.to_vector<float>(), (std::vector<float>{448.0f / 4, 448.0f / 0.5f}));
  // The next step records less: the max of the history still rules; most_recent follows the newest.
  raw::copy_(s.amax, from_vector(std::vector<float>{1, 0.25f}, {2}));
  State r = s;
  r.history = raw::clone(s.history);
  r.amax = raw::clone(s.amax);
  r.scale = raw::clone(s.scale);
  raw::fp8_update_scales(s.history, s.amax, s.scale, s.fp8_max, 0, raw::AmaxCompute::max);
  EXPECT_EQ(s.scale.to_vector<float>(), (std::vector<float>{448.0f / 4, 448.0f / 0.5f}));
  raw::fp8_update_scales(r.history, r.amax, r.scale, r.fp8_max, 0, raw::AmaxCompute::most_recent);
  EXPECT_EQ(r.scale.to_vector<float>(), (std::vector<float>{448.0f / 1, 448.0f / 0.25f}));
  EXPECT_EQ(r.history.to_vector<float>(), (std::vector<float>{1, 4, 2, 0.25f, 0.5f, 0}));
}

TEST(Fp8UpdateScales, MarginDividesByAPowerOfTwoAndTheFormatMaxIsPerEntry) {
  State s = make({0, 0}, {2, 2}, {1, 1});
  raw::copy_(s.fp8_max, from_vector(std::vector<float>{448, 57344}, {2}));
  raw::fp8_update_scales(s.history, s.amax, s.scale, s.fp8_max, 3, raw::AmaxCompute::max);
  EXPECT_EQ(s.scale.to_vector<float>(), (std::vector<float>{448.0f / 2 / 8, 57344.0f / 2 / 8}));
}

TEST(Fp8UpdateScales, ZeroHistoriesKeepTheScaleAndNonFiniteAmaxesAreDropped) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  State s = make({0, 0, /**/ 3, 0, /**/ 3, 0}, {0, inf, nan}, {5, 6, 7});
  raw::fp8_update_scales(s.history, s.amax, s.scale, s.fp8_max, 0, raw::AmaxCompute::max);
  // Entry 0: a zero pushed, nothing to scale by; entries 1 and 2: the inf / NaN dropped, the history kept.
  EXPECT_EQ(s.history.to_vector<float>(), (std::vector<float>{0, 0, 3, 0, 3, 0}));
  EXPECT_EQ(s.scale.to_vector<float>(), (std::vector<float>{5, 448.0f / 3, 448.0f / 3}));
  EXPECT_EQ(s.amax.to_vector<float>(), (std::vector<float>{0, 0, 0}));
}

TEST(Fp8UpdateScales, ASkippedStepDropsEveryAmax) {
  for (const double flag : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    State s = make({2, 1}, {8}, {224});
    raw::fp8_update_scales(s.history, s.amax, s.scale, s.fp8_max, 0, raw::AmaxCompute::max,
                           full({1}, flag, {.dtype = DType::f64}));
    EXPECT_EQ(s.history.to_vector<float>(), (std::vector<float>{2, 1}));
    EXPECT_EQ(s.scale.to_vector<float>(), (std::vector<float>{224}));
    EXPECT_EQ(s.amax.to_vector<float>(), (std::vector<float>{0}));
  }
  State s = make({2, 1}, {8}, {224});  // a finite flag (f32 here) applies the step
  raw::fp8_update_scales(s.history, s.amax, s.scale, s.fp8_max, 0, raw::AmaxCompute::max, full({}, 3.0));
  EXPECT_EQ(s.history.to_vector<float>(), (std::vector<float>{8, 2}));
  EXPECT_EQ(s.scale.to_vector<float>(), (std::vector<float>{56}));
}

// The clipped count: an entry whose step amax times the delayed scale it was cast with exceeds the
// format's max, among entries that had a history (a fresh entry was cast with current scaling).
TEST(Fp8UpdateScales, CountsTheEntriesWhoseAmaxOutgrewTheirScale) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // history max 2 and scale 224 (448 / 2): amaxes 4 (clipped), 2 (exactly at the max: not clipped), 1.5,
  // a fresh entry (zero history) with amax 100, a NaN amax; E5M2's max for the last entry: 57344 / 2.
  State s = make({2, 0, /**/ 2, 1, /**/ 1, 2, /**/ 0, 0, /**/ 2, 0, /**/ 2, 0}, {4, 2, 1.5f, 100, nan, 3},
                 {224, 224, 224, 1, 224, 28672});
  raw::copy_(s.fp8_max, from_vector(std::vector<float>{448, 448, 448, 448, 448, 57344}, {6}));
  const Tensor clipped = zeros({});
  raw::fp8_update_scales(s.history, s.amax, s.scale, s.fp8_max, 0, raw::AmaxCompute::max, Tensor(), clipped);
  EXPECT_EQ(clipped.to_vector<float>()[0], 2.0f);  // entries 0 and 5
  // Counts add up over steps; the margin's headroom is in the scale, so amax 6 against scale 448 / 4 / 2
  // (margin 1) does not clip, amax 9 does.
  raw::copy_(s.amax, from_vector(std::vector<float>{6, 9, 0, 0, 0, 0}, {6}));
  raw::copy_(s.scale, from_vector(std::vector<float>{56, 56, 1, 1, 1, 1}, {6}));
  raw::fp8_update_scales(s.history, s.amax, s.scale, s.fp8_max, 1, raw::AmaxCompute::max, Tensor(), clipped);
  EXPECT_EQ(clipped.to_vector<float>()[0], 3.0f);
  // A skipped step counts nothing.
  raw::copy_(s.amax, from_vector(std::vector<float>{1000, 1000, 0, 0, 0, 0}, {6}));
  raw::fp8_update_scales(s.history, s.amax, s.scale, s.fp8_max, 0, raw::AmaxCompute::max,
                         full({}, std::numeric_limits<double>::infinity()), clipped);
  EXPECT_EQ(clipped.to_vector<float>()[0], 3.0f);
  EXPECT_CPF_ERROR(
      raw::fp8_update_scales(s.history, s.amax, s.scale, s.fp8_max, 0, raw::AmaxCompute::max, Tensor(), zeros({1})),
      "clipped must be a contiguous [] f32 tensor, got [1] f32");
}

TEST(Fp8UpdateScales, RefusesBadArgumentsByName) {
  const State s = make({0, 0, 0, 0}, {0, 0}, {1, 1});
  const auto update = [&](const Tensor& h, const Tensor& a, const Tensor& sc, const Tensor& m, int64_t margin,
                          const Tensor& skip) {
    raw::fp8_update_scales(h, a, sc, m, margin, raw::AmaxCompute::max, skip);
  };
  EXPECT_CPF_ERROR(update(Tensor(), s.amax, s.scale, s.fp8_max, 0, {}), "history must be an (entries, length >= 1)");
  EXPECT_CPF_ERROR(update(zeros({2, 0}), s.amax, s.scale, s.fp8_max, 0, {}),
                   "history must be an (entries, length >= 1)");
  EXPECT_CPF_ERROR(update(raw::to(s.history, DType::f64), s.amax, s.scale, s.fp8_max, 0, {}),
                   "history must be a contiguous");
  EXPECT_CPF_ERROR(update(s.history, zeros({3}), s.scale, s.fp8_max, 0, {}),
                   "amax must be a contiguous [2] f32 tensor, got [3] f32");
  EXPECT_CPF_ERROR(update(s.history, s.amax, Tensor(), s.fp8_max, 0, {}), "scale is undefined");
  EXPECT_CPF_ERROR(update(s.history, s.amax, s.scale, zeros({2}, {.dtype = DType::bf16}), 0, {}),
                   "fp8_max must be a contiguous [2] f32 tensor, got [2] bf16");
  EXPECT_CPF_ERROR(update(s.history, s.amax, s.scale, s.fp8_max, 65, {}), "margin must be in [0, 64], got 65");
  EXPECT_CPF_ERROR(update(s.history, s.amax, s.scale, s.fp8_max, 0, zeros({2}, {.dtype = DType::f64})),
                   "skip_if_nonfinite must be a one-element f32 or f64 tensor, got [2] f64");
  EXPECT_CPF_ERROR(update(s.history, s.amax, s.scale, s.fp8_max, 0, zeros({1}, {.dtype = DType::i64})),
                   "skip_if_nonfinite must be a one-element f32 or f64 tensor");
}

}  // namespace
}  // namespace cpf
