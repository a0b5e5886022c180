// f64 gradcheck of cat/stack/split and the indexing ops, on every device of support/test_device.h
// (index and mask tensors are built on the host and moved to the device under test).
#include <gtest/gtest.h>

#include "framework/autograd/ops.h"
#include "framework/tensor/ops/elementwise.h"
#include "support/gradcheck_utils.h"
#include "support/test_device.h"

namespace cpf {
namespace {

using Inputs = std::vector<Tensor>;

class JoinGradcheck : public testing::DeviceTest {};
class IndexGradcheck : public testing::DeviceTest {};

Tensor bool_tensor(const std::vector<int32_t>& values, const Shape& shape) {
  return raw::to(from_vector(values, shape), DType::boolean);
}

TEST_P(JoinGradcheck, Cat) {
  Tensor a = grad_leaf({2, 3}, 1), b = grad_leaf({4, 3}, 2), c = grad_leaf({1, 3}, 3);
  EXPECT_GRADCHECK([](const Inputs& x) { return cat(x, 0); }, Inputs{a, b, c});
  Tensor p = grad_leaf({3, 2}, 4), q = grad_leaf({3, 5}, 5);
  EXPECT_GRADCHECK([](const Inputs& x) { return cat({x[0], tanh(x[1]), x[0]}, -1); }, Inputs{p, q});
  // A constant (no grad) and an empty piece in the list; a non-contiguous input.
  Tensor fixed = constant({3, 2}, 6);
  Tensor empty_piece = zeros({3, 0}, {.dtype = DType::f64, .device = device()});
  EXPECT_GRADCHECK(
      [&](const Inputs& x) {
        return cat({fixed, transpose(x[0], 0, 1), empty_piece}, 1);
      },
      Inputs{grad_leaf({2, 3}, 7)});
}

TEST_P(JoinGradcheck, Stack) {
  Tensor a = grad_leaf({2, 3}, 8), b = grad_leaf({2, 3}, 9);
  for (int64_t dim : {0, 1, 2, -1}) {
    EXPECT_GRADCHECK([dim](const Inputs& x) { return stack({x[0], x[1], mul(x[0], x[1])}, dim); }, Inputs{a, b});
  }
}

TEST_P(JoinGradcheck, Split) {
  Tensor x = grad_leaf({3, 7}, 10);
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

TEST_P(JoinGradcheck, SplitGradientLandsInTheRightSlices) {
  Tensor x = grad_leaf({2, 5}, 11);
  const auto pieces = split(x, std::vector<int64_t>{2, 3}, 1);
  backward(sum(mul(pieces[1], 3.0)));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{0, 0, 3, 3, 3, 0, 0, 3, 3, 3}));
}

TEST_P(IndexGradcheck, IndexSelectWithRepeatedIndices) {
  Tensor x = grad_leaf({4, 3}, 12);
  Tensor rows = on_device(from_vector<int64_t>({2, 0, 2, 2, 3}, {5}));
  Tensor cols = on_device(from_vector<int32_t>({1, 1, 0}, {3}));
  EXPECT_GRADCHECK([&](const Inputs& in) { return index_select(in[0], 0, rows); }, Inputs{x});
  EXPECT_GRADCHECK([&](const Inputs& in) { return index_select(in[0], -1, cols); }, Inputs{x});
  EXPECT_GRADCHECK([&](const Inputs& in) { return index_select(transpose(in[0], 0, 1), 1, rows); }, Inputs{x});
}

TEST_P(IndexGradcheck, RepeatedIndicesAccumulate) {
  Tensor x = grad_leaf({3, 2}, 13);
  backward(sum(index_select(x, 0, on_device(from_vector<int64_t>({1, 1, 1, 0}, {4})))));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{1, 1, 3, 3, 0, 0}));
  Tensor y = grad_leaf({2, 3}, 14);
  backward(sum(gather(y, 1, on_device(from_vector<int32_t>({2, 2, 0, 1, 1, 1}, {2, 3})))));
  EXPECT_EQ(y.grad().to_vector<double>(), (std::vector<double>{1, 0, 2, 0, 3, 0}));
}

TEST_P(IndexGradcheck, GatherWithRepeatedIndices) {
  Tensor x = grad_leaf({3, 4}, 15);
  Tensor along_cols = on_device(from_vector<int64_t>({3, 3, 0, 1, 1, 1, 2, 0, 2, 2, 2, 2, 0, 3, 3}, {3, 5}));
  EXPECT_GRADCHECK([&](const Inputs& in) { return gather(in[0], 1, along_cols); }, Inputs{x});
  Tensor along_rows = on_device(from_vector<int32_t>({0, 0, 2, 1, 0, 2, 2, 1}, {2, 4}));
  EXPECT_GRADCHECK([&](const Inputs& in) { return gather(in[0], -2, along_rows); }, Inputs{x});
}

TEST_P(IndexGradcheck, ScatterAdd) {
  Tensor x = grad_leaf({3, 4}, 16);
  Tensor src = grad_leaf({5, 4}, 17);
  Tensor index = on_device(from_vector<int64_t>({0, 2, 2, 1, 0, 0, 2, 1, 1, 2, 0, 1, 2, 1, 0, 0, 0, 0, 1, 2}, {5, 4}));
  EXPECT_GRADCHECK([&](const Inputs& in) { return scatter_add(in[0], 0, index, in[1]); }, Inputs{x, src});
  Tensor src_cols = grad_leaf({3, 6}, 18);
  Tensor index_cols = on_device(from_vector<int32_t>({3, 3, 3, 0, 1, 1, 2, 0, 0, 0, 3, 1, 1, 1, 2, 2, 0, 3}, {3, 6}));
  EXPECT_GRADCHECK([&](const Inputs& in) { return scatter_add(mul(in[0], in[0]), -1, index_cols, tanh(in[1])); },
                   Inputs{x, src_cols});
}

TEST_P(IndexGradcheck, WhereWithBroadcasting) {
  Tensor cond = on_device(bool_tensor({1, 0, 1}, {3, 1}));
  Tensor a = grad_leaf({3, 4}, 19), b = grad_leaf({4}, 20);
  EXPECT_GRADCHECK([&](const Inputs& in) { return where(cond, in[0], in[1]); }, Inputs{a, b});
  // The condition broadcasts the output beyond both operands.
  Tensor wide_cond = on_device(bool_tensor({1, 0, 0, 1, 1, 0}, {2, 1, 3}));
  Tensor p = grad_leaf({4, 1}, 21), q = grad_leaf({1, 3}, 22);
  EXPECT_GRADCHECK([&](const Inputs& in) { return where(wide_cond, in[0], in[1]); }, Inputs{p, q});
}

TEST_P(IndexGradcheck, MaskedFill) {
  Tensor x = grad_leaf({3, 4}, 23);
  Tensor mask = on_device(bool_tensor({1, 0, 0, 1}, {4}));
  EXPECT_GRADCHECK([&](const Inputs& in) { return masked_fill(in[0], mask, -2.0); }, Inputs{x});
  Tensor full_mask = raw::compare(raw::CompareOp::gt, constant({3, 4}, 24), 0.0);
  EXPECT_GRADCHECK([&](const Inputs& in) { return masked_fill(exp(in[0]), full_mask, 0.0); }, Inputs{x});
  Tensor y = grad_leaf({2, 2}, 25);
  backward(sum(masked_fill(y, on_device(bool_tensor({0, 1, 1, 0}, {2, 2})), 5.0)));
  EXPECT_EQ(y.grad().to_vector<double>(), (std::vector<double>{1, 0, 0, 1}));
}

CPF_INSTANTIATE_DEVICE_SUITE(JoinGradcheck);
CPF_INSTANTIATE_DEVICE_SUITE(IndexGradcheck);

}  // namespace
}  // namespace cpf
