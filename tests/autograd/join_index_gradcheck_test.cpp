#include <gtest/gtest.h>

#include "framework/autograd/ops.h"
#include "framework/tensor/ops/elementwise.h"
#include "support/gradcheck_utils.h"

namespace cpf {
namespace {

using testing::grad_input;
using Inputs = std::vector<Tensor>;

Tensor bool_tensor(const std::vector<int32_t>& values, const Shape& shape) {
  return raw::to(from_vector(values, shape), DType::boolean);
}

TEST(JoinGradcheck, Cat) {
  Tensor a = grad_input({2, 3}, 1), b = grad_input({4, 3}, 2), c = grad_input({1, 3}, 3);
  EXPECT_GRADCHECK([](const Inputs& x) { return cat(x, 0); }, Inputs{a, b, c});
  Tensor p = grad_input({3, 2}, 4), q = grad_input({3, 5}, 5);
  EXPECT_GRADCHECK([](const Inputs& x) { return cat({x[0], tanh(x[1]), x[0]}, -1); }, Inputs{p, q});
  // A constant (no grad) and an empty piece in the list; a non-contiguous input.
  Tensor constant = testing::random_tensor({3, 2}, DType::f64, 6);
  Tensor empty_piece = zeros({3, 0}, {.dtype = DType::f64});
  EXPECT_GRADCHECK(
      [&](const Inputs& x) {
        return cat({constant, transpose(x[0], 0, 1), empty_piece}, 1);
      },
      Inputs{grad_input({2, 3}, 7)});
}

TEST(JoinGradcheck, Stack) {
  Tensor a = grad_input({2, 3}, 8), b = grad_input({2, 3}, 9);
  for (int64_t dim : {0, 1, 2, -1}) {
    EXPECT_GRADCHECK([dim](const Inputs& x) { return stack({x[0], x[1], mul(x[0], x[1])}, dim); }, Inputs{a, b});
  }
}

TEST(JoinGradcheck, Split) {
  Tensor x = grad_input({3, 7}, 10);
  EXPECT_GRADCHECK([](const Inputs& in) { return split(in[0], std::vector<int64_t>{2, 0, 4, 1}, 1); }, Inputs{x});
  EXPECT_GRADCHECK([](const Inputs& in) { return split(in[0], 3, -1); }, Inputs{x});
  EXPECT_GRADCHECK([](const Inputs& in) { return split(in[0], 2, 0); }, Inputs{x});
  // Pieces used unequally, one not at all: its gradient counts as zero.
  EXPECT_GRADCHECK(
      [](const Inputs& in) {
        const auto pieces = split(in[0], 3, 1);
        return mul(pieces[0], exp(pieces[1]));
      },
      Inputs{x});
}

TEST(JoinGradcheck, SplitGradientLandsInTheRightSlices) {
  Tensor x = grad_input({2, 5}, 11);
  const auto pieces = split(x, std::vector<int64_t>{2, 3}, 1);
  backward(sum(mul(pieces[1], 3.0)));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{0, 0, 3, 3, 3, 0, 0, 3, 3, 3}));
}

TEST(IndexGradcheck, IndexSelectWithRepeatedIndices) {
  Tensor x = grad_input({4, 3}, 12);
  Tensor rows = from_vector<int64_t>({2, 0, 2, 2, 3}, {5});
  Tensor cols = from_vector<int32_t>({1, 1, 0}, {3});
  EXPECT_GRADCHECK([&](const Inputs& in) { return index_select(in[0], 0, rows); }, Inputs{x});
  EXPECT_GRADCHECK([&](const Inputs& in) { return index_select(in[0], -1, cols); }, Inputs{x});
  EXPECT_GRADCHECK([&](const Inputs& in) { return index_select(transpose(in[0], 0, 1), 1, rows); }, Inputs{x});
}

TEST(IndexGradcheck, RepeatedIndicesAccumulate) {
  Tensor x = grad_input({3, 2}, 13);
  backward(sum(index_select(x, 0, from_vector<int64_t>({1, 1, 1, 0}, {4}))));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{1, 1, 3, 3, 0, 0}));
  Tensor y = grad_input({2, 3}, 14);
  backward(sum(gather(y, 1, from_vector<int32_t>({2, 2, 0, 1, 1, 1}, {2, 3}))));
  EXPECT_EQ(y.grad().to_vector<double>(), (std::vector<double>{1, 0, 2, 0, 3, 0}));
}

TEST(IndexGradcheck, GatherWithRepeatedIndices) {
  Tensor x = grad_input({3, 4}, 15);
  Tensor along_cols = from_vector<int64_t>({3, 3, 0, 1, 1, 1, 2, 0, 2, 2, 2, 2, 0, 3, 3}, {3, 5});
  EXPECT_GRADCHECK([&](const Inputs& in) { return gather(in[0], 1, along_cols); }, Inputs{x});
  Tensor along_rows = from_vector<int32_t>({0, 0, 2, 1, 0, 2, 2, 1}, {2, 4});
  EXPECT_GRADCHECK([&](const Inputs& in) { return gather(in[0], -2, along_rows); }, Inputs{x});
}

TEST(IndexGradcheck, ScatterAdd) {
  Tensor x = grad_input({3, 4}, 16);
  Tensor src = grad_input({5, 4}, 17);
  Tensor index = from_vector<int64_t>({0, 2, 2, 1, 0, 0, 2, 1, 1, 2, 0, 1, 2, 1, 0, 0, 0, 0, 1, 2}, {5, 4});
  EXPECT_GRADCHECK([&](const Inputs& in) { return scatter_add(in[0], 0, index, in[1]); }, Inputs{x, src});
  Tensor src_cols = grad_input({3, 6}, 18);
  Tensor index_cols = from_vector<int32_t>({3, 3, 3, 0, 1, 1, 2, 0, 0, 0, 3, 1, 1, 1, 2, 2, 0, 3}, {3, 6});
  EXPECT_GRADCHECK([&](const Inputs& in) { return scatter_add(mul(in[0], in[0]), -1, index_cols, tanh(in[1])); },
                   Inputs{x, src_cols});
}

TEST(IndexGradcheck, WhereWithBroadcasting) {
  Tensor cond = bool_tensor({1, 0, 1}, {3, 1});
  Tensor a = grad_input({3, 4}, 19), b = grad_input({4}, 20);
  EXPECT_GRADCHECK([&](const Inputs& in) { return where(cond, in[0], in[1]); }, Inputs{a, b});
  // The condition broadcasts the output beyond both operands.
  Tensor wide_cond = bool_tensor({1, 0, 0, 1, 1, 0}, {2, 1, 3});
  Tensor p = grad_input({4, 1}, 21), q = grad_input({1, 3}, 22);
  EXPECT_GRADCHECK([&](const Inputs& in) { return where(wide_cond, in[0], in[1]); }, Inputs{p, q});
}

TEST(IndexGradcheck, MaskedFill) {
  Tensor x = grad_input({3, 4}, 23);
  Tensor mask = bool_tensor({1, 0, 0, 1}, {4});
  EXPECT_GRADCHECK([&](const Inputs& in) { return masked_fill(in[0], mask, -2.0); }, Inputs{x});
  Tensor full_mask = raw::compare(raw::CompareOp::gt, testing::random_tensor({3, 4}, DType::f64, 24), 0.0);
  EXPECT_GRADCHECK([&](const Inputs& in) { return masked_fill(exp(in[0]), full_mask, 0.0); }, Inputs{x});
  Tensor y = grad_input({2, 2}, 25);
  backward(sum(masked_fill(y, bool_tensor({0, 1, 1, 0}, {2, 2}), 5.0)));
  EXPECT_EQ(y.grad().to_vector<double>(), (std::vector<double>{1, 0, 0, 1}));
}

}  // namespace
}  // namespace cpf
