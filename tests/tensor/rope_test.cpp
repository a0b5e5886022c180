#include "framework/tensor/ops/rope.h"

#include <gtest/gtest.h>

#include <cmath>

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
