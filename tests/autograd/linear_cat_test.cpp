// linear_cat (framework/autograd/functions/linear_cat.h): one GEMM for several linears of one input
// equals the separate linears (values and every gradient, f64 and bf16 with f32 masters and compute
// copies), and every rejected combination names the values. swiglu_packed's refusal is here too (the
// autograd wrappers of the fused MLP path). f64 gradchecks are the device cases (op_cases_nn.h).
#include <gtest/gtest.h>

#include "framework/autograd/functions/linear_cat.h"
#include "framework/autograd/ops.h"
#include "framework/tensor/ops/join.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

using testing::all_close;
using testing::random_tensor;

Tensor leaf(const Shape& shape, uint64_t seed, DType dtype = DType::f64) {
  Tensor t = raw::to(random_tensor(shape, DType::f64, seed), dtype);
  t.set_requires_grad(true);
  return t;
}

// x and the parts' leaves (fresh, same values for a seed); `fused` picks linear_cat (with min_fused_rows)
// or separate linears. Returns the output and every leaf's gradient of sum(y * probe).
std::vector<Tensor> run(bool fused, bool bias, int64_t min_fused_rows = 0) {
  const Tensor x = leaf({2, 3, 6}, 1);
  const std::vector<Tensor> w{leaf({4, 6}, 2), leaf({2, 6}, 3), leaf({2, 6}, 4)};
  const std::vector<Tensor> b{leaf({4}, 5), leaf({2}, 6), leaf({2}, 7)};
  Tensor y;
  if (fused) {
    std::vector<LinearWeights> parts;
    for (size_t i = 0; i < w.size(); ++i) parts.push_back({w[i], bias ? b[i] : Tensor()});
    y = linear_cat(x, parts, min_fused_rows);  // (2, 3, 8)
  } else {
    std::vector<Tensor> pieces;
    for (size_t i = 0; i < w.size(); ++i) pieces.push_back(linear(x, w[i], bias ? b[i] : Tensor()));
    y = cat(pieces, -1);
  }
  backward(sum(mul(y, random_tensor({2, 3, 8}, DType::f64, 8))));
  std::vector<Tensor> out{y.detach(), x.grad()};
  for (size_t i = 0; i < w.size(); ++i) {
    out.push_back(w[i].grad());
    if (bias) out.push_back(b[i].grad());
  }
  return out;
}

TEST(LinearCat, EqualsSeparateLinearsWithTheirGradients) {
  for (bool bias : {false, true}) {
    const std::vector<Tensor> fused = run(true, bias), separate = run(false, bias);
    ASSERT_EQ(fused.size(), separate.size());
    for (size_t i = 0; i < fused.size(); ++i) {
      ASSERT_TRUE(fused[i].defined()) << "entry " << i;
      EXPECT_TRUE(all_close(fused[i], separate[i], 1e-13, 1e-13)) << "bias " << bias << " entry " << i;
    }
  }
}

TEST(LinearCat, BelowMinFusedRowsRunsTheSameSeparateLinears) {
  // 6 rows: fused with min_fused_rows 6, separate with 7 (and with the default 128).
  for (int64_t min_rows : {int64_t{6}, int64_t{7}, kLinearCatMinFusedRows}) {
    const std::vector<Tensor> got = run(true, true, min_rows), separate = run(false, true);
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(all_close(got[i], separate[i], 1e-13, 1e-13)) << "min_fused_rows " << min_rows << " entry " << i;
    }
  }
}

TEST(LinearCat, MixedPrecisionReadsTheComputeCopies) {
  // f32 masters with bf16 x: the GEMM reads the compute copies (here deliberately different from the
  // masters' bf16 rounding, to see which is read) and the masters get f32 gradients.
  const Tensor x = raw::to(random_tensor({5, 8}, DType::f64, 11), DType::bf16);
  const Tensor w1 = leaf({8, 8}, 12, DType::f32), w2 = leaf({8, 8}, 13, DType::f32);
  const Tensor c1 = raw::to(random_tensor({8, 8}, DType::f64, 14), DType::bf16);
  const Tensor c2 = raw::to(random_tensor({8, 8}, DType::f64, 15), DType::bf16);
  const Tensor y = linear_cat(x, {{w1, Tensor(), c1}, {w2, Tensor(), c2}}, 0);
  EXPECT_EQ(y.dtype(), DType::bf16);
  EXPECT_TRUE(all_close(y, cat({linear(x, w1, Tensor(), c1), linear(x, w2, Tensor(), c2)}, -1), 0, 0));
  backward(sum(to(y, DType::f32)));
  EXPECT_EQ(w1.grad().dtype(), DType::f32);
  EXPECT_EQ(w2.grad().shape(), (Shape{8, 8}));
}

// A kept concatenation (nn::ComputeCopies::find_stacked) runs one GEMM for a few rows: the same values as
// the parts run apart, and the same gradients for the masters.
TEST(LinearCat, AKeptConcatenationRunsOneGemmForFewRows) {
  const Tensor x = raw::to(random_tensor({3, 8}, DType::f64, 31), DType::bf16);  // 3 rows, below 128
  const Tensor w1 = leaf({8, 8}, 32, DType::f32), w2 = leaf({4, 8}, 33, DType::f32);
  const Tensor b1 = leaf({8}, 34, DType::f32), b2 = leaf({4}, 35, DType::f32);
  const Tensor c1 = raw::to(w1, DType::bf16), c2 = raw::to(w2, DType::bf16);
  const Tensor cb1 = raw::to(b1, DType::bf16), cb2 = raw::to(b2, DType::bf16);
  const std::vector<LinearWeights> parts = {{w1, b1, c1, cb1}, {w2, b2, c2, cb2}};
  const LinearCatStacked kept{raw::cat({c1, c2}, 0), raw::cat({cb1, cb2}, 0)};
  const Tensor y = linear_cat(x, parts, kLinearCatMinFusedRows, kept);
  EXPECT_TRUE(all_close(y, cat({linear(x, parts[0]), linear(x, parts[1])}, -1), 0, 0));
  backward(sum(to(y, DType::f32)));
  EXPECT_EQ(w1.grad().dtype(), DType::f32);
  EXPECT_EQ(b2.grad().shape(), (Shape{4}));
  // The kept tensors must be the concatenation's shape and x's dtype, with a bias exactly when the parts have one.
  EXPECT_CPF_ERROR(linear_cat(x, parts, kLinearCatMinFusedRows, {c1, kept.bias}),
                   "linear_cat: the stacked weight must be (12, 8) bf16, got [8,8] bf16");
  EXPECT_CPF_ERROR(linear_cat(x, parts, kLinearCatMinFusedRows, {raw::to(kept.weight, DType::f32), kept.bias}),
                   "the stacked weight must be (12, 8) bf16, got [12,8] f32");
  EXPECT_CPF_ERROR(linear_cat(x, parts, kLinearCatMinFusedRows, {kept.weight, Tensor()}),
                   "the stacked bias must be a (12) bf16 tensor, got []");
  EXPECT_CPF_ERROR(linear_cat(x, {{w1, Tensor(), c1}, {w2, Tensor(), c2}}, kLinearCatMinFusedRows, kept),
                   "the stacked bias must be undefined (the parts have no bias), got [12]");
}

TEST(LinearCat, RejectsBadParts) {
  const Tensor x = random_tensor({3, 4}, DType::f32, 21);
  const Tensor w = random_tensor({2, 4}, DType::f32, 22);
  EXPECT_CPF_ERROR(linear_cat(Tensor(), {{w}}), "linear_cat: x must be a defined tensor");
  EXPECT_CPF_ERROR(linear_cat(x, {}), "linear_cat: needs at least one LinearWeights");
  EXPECT_CPF_ERROR(linear_cat(x, {{w}, {random_tensor({2, 5}, DType::f32, 23)}}),
                   "part 1's weight must be (N, K) with K = x's last dim 4, got [2,5]");
  EXPECT_CPF_ERROR(linear_cat(x, {{w}, {random_tensor({2, 4}, DType::f64, 24)}}),
                   "part 1's weight is f64 on cpu but part 0's is f32 on cpu");
  EXPECT_CPF_ERROR(linear_cat(raw::to(x, DType::f64), {{w}}), "input dtype f64 does not match the weight dtype f32");
  EXPECT_CPF_ERROR(linear_cat(x, {{w, zeros({2})}, {w}}), "part 1 has no bias but part 0 has one");
  EXPECT_CPF_ERROR(linear_cat(x, {{w, zeros({3})}}),
                   "part 0's bias must be (N) = (2) of the weight dtype f32, got [3]");
  EXPECT_CPF_ERROR(linear_cat(raw::to(x, DType::bf16), {{w, Tensor(), zeros({2, 4})}}),
                   "part 0's compute_weight must be the weight [2,4] in x's dtype bf16, got [2,4] f32");
  EXPECT_CPF_ERROR(linear_cat(x, {{w}}, -1), "linear_cat: min_fused_rows must be >= 0, got -1");
}

TEST(SwigluPacked, RejectsAnOddWidth) {
  EXPECT_CPF_ERROR(swiglu_packed(zeros({2, 5})), "swiglu_packed: h must be (..., 2 I) with an even last dim");
  EXPECT_CPF_ERROR(swiglu_packed(Tensor()), "swiglu_packed: h must be");
}

}  // namespace
}  // namespace cpf
