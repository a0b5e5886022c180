#include "framework/tensor/ops/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "framework/tensor/ops/views.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

using testing::all_close;
using testing::random_tensor;

// Plain loops in double over (b, t, h) and pairs (i, i + rot/2).
Tensor reference_rope(const Tensor& x, const Tensor& positions, double base, int64_t rot, bool inverse) {
  const bool thd = x.dim() == 3;
  const int64_t batch = thd ? 1 : x.size(0), seq = x.size(-3), heads = x.size(-2), dim = x.size(-1);
  if (rot < 0) rot = dim;
  const auto xv = x.to_vector<double>();
  const auto pv = positions.to_vector<int64_t>();
  std::vector<double> out(xv);
  const int64_t half = rot / 2;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < seq; ++t) {
      const double p = static_cast<double>(positions.dim() == 2 ? pv[b * seq + t] : pv[t]);
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t off = ((b * seq + t) * heads + h) * dim;
        for (int64_t i = 0; i < half; ++i) {
          const double angle = p * std::pow(base, -2.0 * i / rot);
          const double c = std::cos(angle), s = inverse ? -std::sin(angle) : std::sin(angle);
          const double x1 = xv[off + i], x2 = xv[off + i + half];
          out[off + i] = x1 * c - x2 * s;
          out[off + i + half] = x2 * c + x1 * s;
        }
      }
    }
  }
  return from_vector(out, x.shape());
}

TEST(Rope, BshdMatchesReference) {
  for (DType dtype : {DType::f32, DType::f64}) {
    const double tol = dtype == DType::f32 ? 1e-6 : 1e-12;
    const Tensor x = random_tensor({2, 5, 3, 8}, dtype, 1);
    const Tensor pos_t = from_vector<int64_t>({0, 1, 2, 7, 100}, {5});
    const Tensor pos_bt = from_vector<int32_t>({3, 4, 5, 6, 7, 0, 0, 1, 1, 2}, {2, 5});
    for (const Tensor& pos : {pos_t, pos_bt}) {
      for (bool inverse : {false, true}) {
        const Tensor y = raw::rope(x, pos, 10000.0, -1, inverse);
        EXPECT_EQ(y.dtype(), dtype);
        EXPECT_TRUE(all_close(y, reference_rope(x, pos, 10000.0, -1, inverse), tol, tol)) << shape_str(pos.shape());
      }
    }
  }
}

TEST(Rope, ThdAndPartialRotation) {
  const Tensor x = random_tensor({6, 2, 10}, DType::f64, 2);
  const Tensor pos = from_vector<int64_t>({0, 1, 2, 0, 1, 2}, {6});  // two packed sequences
  EXPECT_TRUE(all_close(raw::rope(x, pos), reference_rope(x, pos, 10000.0, -1, false), 1e-12, 1e-12));
  const Tensor y = raw::rope(x, pos, 500.0, 4);
  EXPECT_TRUE(all_close(y, reference_rope(x, pos, 500.0, 4, false), 1e-12, 1e-12));
  // Dims beyond rotary_dim pass through bit for bit.
  EXPECT_TRUE(all_close(raw::narrow(y, 2, 4, 6), raw::narrow(x, 2, 4, 6), 0, 0));
}

TEST(Rope, KnownValuesAndIdentityAtZero) {
  // D = 2, one pair rotated by pos * base^0 = pos radians.
  const Tensor x = from_vector<double>({1.0, 2.0, 1.0, 2.0}, {2, 1, 2});
  const Tensor pos = from_vector<int64_t>({0, 1}, {2});
  const auto y = raw::rope(x, pos).to_vector<double>();
  EXPECT_DOUBLE_EQ(y[0], 1.0);
  EXPECT_DOUBLE_EQ(y[1], 2.0);
  EXPECT_NEAR(y[2], std::cos(1.0) - 2.0 * std::sin(1.0), 1e-15);
  EXPECT_NEAR(y[3], 2.0 * std::cos(1.0) + std::sin(1.0), 1e-15);
}

TEST(Rope, InverseUndoesTheRotationAndIsTheBackward) {
  const Tensor x = random_tensor({2, 7, 4, 16}, DType::f64, 3);
  const Tensor pos = from_vector<int64_t>({-3, 0, 5, 9, 1000, 65535, 123456}, {7});
  const Tensor y = raw::rope(x, pos, 10000.0, 12);
  EXPECT_TRUE(all_close(raw::rope(y, pos, 10000.0, 12, true), x, 1e-12, 1e-12));
  EXPECT_TRUE(all_close(raw::rope_backward(y, pos, 10000.0, 12), x, 1e-12, 1e-12));
  EXPECT_TRUE(all_close(raw::rope_backward(x, pos, 10000.0, 12, true), y, 0, 0));
  // Large positions: angles in double keep f64 results at reference accuracy.
  EXPECT_TRUE(all_close(y, reference_rope(x, pos, 10000.0, 12, false), 1e-11, 1e-11));
}

TEST(Rope, StridedInputs) {
  // q as a slice of a fused (B, T, 3H, D) projection: unit inner stride, used without a copy.
  const Tensor qkv = random_tensor({2, 4, 9, 8}, DType::f32, 4);
  const Tensor q = raw::narrow(qkv, 2, 3, 3);
  ASSERT_FALSE(q.is_contiguous());
  const Tensor pos = from_vector<int64_t>({0, 1, 2, 3}, {4});
  EXPECT_TRUE(all_close(raw::rope(q, pos), reference_rope(q, pos, 10000.0, -1, false), 1e-6, 1e-6));
  // (B, H, T, D) transposed to (B, T, H, D).
  const Tensor bhtd = raw::transpose(random_tensor({2, 3, 4, 8}, DType::f64, 5), 1, 2);
  EXPECT_TRUE(all_close(raw::rope(bhtd, pos), reference_rope(bhtd, pos, 10000.0, -1, false), 1e-12, 1e-12));
  // Non-unit stride along D: copied first.
  const Tensor odd = raw::transpose(random_tensor({4, 2, 6}, DType::f64, 6), 0, 2);  // (6, 2, 4), D stride 12
  const Tensor pos6 = from_vector<int64_t>({5, 4, 3, 2, 1, 0}, {6});
  EXPECT_TRUE(all_close(raw::rope(odd, pos6), reference_rope(odd, pos6, 10000.0, -1, false), 1e-12, 1e-12));
}

TEST(Rope, Bf16AndThreadedSizes) {
  const Tensor x = raw::to(random_tensor({2, 3, 2, 8}, DType::f32, 7), DType::bf16);
  const Tensor pos = from_vector<int64_t>({1, 2, 3}, {3});
  const Tensor y = raw::rope(x, pos);
  EXPECT_EQ(y.dtype(), DType::bf16);
  EXPECT_TRUE(all_close(y, reference_rope(x, pos, 10000.0, -1, false), 1e-2, 1e-2));
  const Tensor big = random_tensor({2, 128, 8, 64}, DType::f32, 8);
  const Tensor pos_bt = randint(0, 4096, {2, 128}, {.dtype = DType::i32});
  EXPECT_TRUE(all_close(raw::rope(big, pos_bt), reference_rope(big, pos_bt, 10000.0, -1, false), 1e-5, 1e-5));
}

// Llama 3's scaling (rope_frequencies.h) against transformers' own frequencies for Llama 3.2 (head dim 64,
// rope_theta 500000, factor 32, low / high frequency factors 1 / 4, original context 8192), computed by
// transformers 5.25's ROPE_INIT_FUNCTIONS["llama3"] in f32: the high frequencies kept, the low ones divided
// by 32, the band between them smoothed.
TEST(Rope, Llama3FrequenciesAreTransformers) {
  const std::vector<double> transformers = {1.0,
                                            0.663601279258728,
                                            0.44036662578582764,
                                            0.2922278344631195,
                                            0.193922758102417,
                                            0.12868738174438477,
                                            0.08539710193872452,
                                            0.05666961893439293,
                                            0.03760603070259094,
                                            0.02495540864765644,
                                            0.016560440883040428,
                                            0.010989529080688953,
                                            0.00729266507551074,
                                            0.00483942124992609,
                                            0.0032114461064338684,
                                            0.0012905480107292533,
                                            0.000429556705057621,
                                            9.708286233944818e-05,
                                            1.9461638657958247e-05,
                                            1.291476746700937e-05,
                                            8.570255886297673e-06,
                                            5.687232260243036e-06,
                                            3.7740544485131977e-06,
                                            2.504467147446121e-06,
                                            1.6619674170215148e-06,
                                            1.1028836297555245e-06,
                                            7.318749339901842e-07,
                                            4.856731266045244e-07,
                                            3.2229328894572973e-07,
                                            2.1387423032592778e-07,
                                            1.4192720243499934e-07,
                                            9.418306490260875e-08};
  const RopeFrequencies f{
      .base = 500000.0,
      .scaling = {.factor = 32, .low_freq_factor = 1, .high_freq_factor = 4, .original_context = 8192}};
  ASSERT_EQ(transformers.size(), 32u);
  for (int64_t i = 0; i < 32; ++i) {
    const double ours = f.of_pair(i, 64);
    EXPECT_NEAR(ours, transformers[i], 1e-6 * transformers[i]) << "pair " << i;  // a few f32 roundings against double
  }
  // Unscaled, the frequencies are base^(-2i / R) exactly, as before the scaling existed.
  const RopeFrequencies plain{.base = 500000.0};
  for (int64_t i = 0; i < 32; ++i) EXPECT_EQ(plain.of_pair(i, 64), std::pow(500000.0, -2.0 * i / 64)) << i;
}

// The scaled rotation on the CPU: each pair turned by position x its scaled frequency.
TEST(Rope, ScaledFrequenciesRotateEachPairByThem) {
  const RopeFrequencies f{
      .base = 20000.0, .scaling = {.factor = 8, .low_freq_factor = 0.5, .high_freq_factor = 8, .original_context = 64}};
  const Tensor x = random_tensor({1, 3, 2, 8}, DType::f64, 5);
  const Tensor pos = from_vector<int64_t>({0, 20, 180}, {3});
  const Tensor y = raw::rope(x, pos, f);
  const auto xv = x.to_vector<double>(), yv = y.to_vector<double>();
  for (int64_t t = 0; t < 3; ++t) {
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t i = 0; i < 4; ++i) {
        const int64_t off = (t * 2 + h) * 8;
        const double angle = static_cast<double>(pos.to_vector<int64_t>()[t]) * f.of_pair(i, 8);
        EXPECT_NEAR(yv[off + i], xv[off + i] * std::cos(angle) - xv[off + i + 4] * std::sin(angle), 1e-12);
        EXPECT_NEAR(yv[off + i + 4], xv[off + i + 4] * std::cos(angle) + xv[off + i] * std::sin(angle), 1e-12);
      }
    }
  }
  // The three branches: pair 0 kept (wavelength 6.3 < 64 / 8), pair 1 smoothed, pairs 2 and 3 divided by 8.
  EXPECT_EQ(f.of_pair(0, 8), 1.0);
  const double p1 = std::pow(20000.0, -0.25);
  EXPECT_GT(f.of_pair(1, 8), p1 / 8);
  EXPECT_LT(f.of_pair(1, 8), p1);
  EXPECT_DOUBLE_EQ(f.of_pair(3, 8), std::pow(20000.0, -0.75) / 8);
  EXPECT_TRUE(all_close(raw::rope_backward(y, pos, f), x, 1e-12, 1e-12)) << "the backward is the inverse";
}

TEST(Rope, RejectsBadScaling) {
  const Tensor x = random_tensor({3, 2, 8}, DType::f32);
  const Tensor pos = from_vector<int64_t>({0, 1, 2}, {3});
  EXPECT_CPF_ERROR(raw::rope(x, pos, RopeFrequencies{.scaling = {.factor = 0.5}}),
                   "rope: the RoPE scaling factor must be finite and >= 1 (1: none), got 0.5");
  EXPECT_CPF_ERROR(
      raw::rope(x, pos, RopeFrequencies{.scaling = {.factor = 8, .low_freq_factor = 4, .high_freq_factor = 1}}),
      "rope: Llama 3 RoPE scaling needs 0 < low_freq_factor < high_freq_factor, got 4 and 1");
  EXPECT_CPF_ERROR(raw::rope(x, pos, RopeFrequencies{.scaling = {.factor = 8, .original_context = 0}}),
                   "rope: Llama 3 RoPE scaling needs original_max_position_embeddings > 0, got 0");
}

TEST(Rope, RejectsBadInputs) {
  const Tensor x = random_tensor({2, 3, 4, 8}, DType::f32);
  const Tensor pos = from_vector<int64_t>({0, 1, 2}, {3});
  EXPECT_CPF_ERROR(raw::rope(Tensor(), pos), "rope: argument 'x' is an undefined tensor");
  EXPECT_CPF_ERROR(raw::rope(x, Tensor()), "rope: argument 'positions' is an undefined tensor");
  EXPECT_CPF_ERROR(raw::rope(zeros({3, 4, 8}, {.dtype = DType::i64}), pos),
                   "rope: x must be a floating tensor, got i64");
  EXPECT_CPF_ERROR(raw::rope(random_tensor({3, 8}, DType::f32), pos),
                   "rope: x must be (B, T, H, D) [bshd] or (T, H, D) [thd], got shape [3,8]");
  EXPECT_CPF_ERROR(raw::rope(x, random_tensor({3}, DType::f32)), "rope: positions must be i32 or i64, got f32");
  EXPECT_CPF_ERROR(raw::rope(x, from_vector<int64_t>({0, 1}, {2})),
                   "rope: positions must have shape [T]=[3] or [B, T]=[2,3] for x [2,3,4,8] (bshd), got [2]");
  EXPECT_CPF_ERROR(raw::rope(x, zeros({3, 2}, {.dtype = DType::i64})),
                   "rope: positions must have shape [T]=[3] or [B, T]=[2,3] for x [2,3,4,8] (bshd), got [3,2]");
  EXPECT_CPF_ERROR(raw::rope(random_tensor({3, 4, 8}, DType::f32), zeros({1, 3}, {.dtype = DType::i64})),
                   "rope: positions must have shape [T]=[3] for x [3,4,8] (thd), got [1,3]");
  EXPECT_CPF_ERROR(raw::rope(x, pos, 10000.0, 5), "rope: rotary_dim must be even and in 1..D=8, got 5 for x [2,3,4,8]");
  EXPECT_CPF_ERROR(raw::rope(x, pos, 10000.0, 10), "rope: rotary_dim must be even and in 1..D=8, got 10");
  EXPECT_CPF_ERROR(raw::rope(x, pos, 10000.0, 0), "rope: rotary_dim must be even and in 1..D=8, got 0");
  EXPECT_CPF_ERROR(raw::rope(x, pos, 10000.0, -2), "rope: rotary_dim must be even and in 1..D=8, got -2");
  EXPECT_CPF_ERROR(raw::rope(random_tensor({3, 4, 7}, DType::f32), pos),
                   "rope: rotary_dim must be even and in 1..D=7, got 7 (rotary_dim=-1 means D) for x [3,4,7]");
  EXPECT_CPF_ERROR(raw::rope(x, pos, 0.0), "rope: base must be finite and > 0, got 0");
  EXPECT_CPF_ERROR(raw::rope(x, pos, INFINITY), "rope: base must be finite and > 0, got inf");
  EXPECT_CPF_ERROR(raw::rope_backward(x, pos, 10000.0, 3), "rope: rotary_dim must be even and in 1..D=8, got 3");
}

}  // namespace
}  // namespace cpf
