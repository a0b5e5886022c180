// split's backward joins its pieces' gradients without a copy when they already are adjacent views of
// one buffer, in order (the layout cuDNN attention writes dq/dk/dv in, attention/cuda/cudnn/fused_attention.cpp),
// and copies them into a fresh gradient otherwise; both give the same values.
#include <gtest/gtest.h>

#include <functional>
#include <memory>

#include "framework/autograd/engine.h"
#include "framework/autograd/functions/join.h"
#include "framework/autograd/node.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/views.h"

namespace cpf {
namespace {

// 0, 1, 2, ... as f64 in `shape`.
Tensor iota(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<double> values(static_cast<size_t>(n));
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<double>(i);
  return from_vector(values, shape);
}

// A scalar recorded on `pieces` whose backward hands each piece the gradient make_grads gives.
Tensor sink(const std::vector<Tensor>& pieces, std::function<autograd::GradList()> make_grads) {
  return autograd::record("test_sink", zeros({}, {.dtype = DType::f64}), pieces,
                          [make_grads](const autograd::GradList&) { return make_grads(); });
}

// x passed through a node that keeps the gradient it receives in *seen (a leaf's accumulator may copy).
Tensor probe(const Tensor& x, const std::shared_ptr<Tensor>& seen) {
  return autograd::record("test_probe", raw::clone(x), {x}, [seen](const autograd::GradList& g) {
    *seen = g[0];
    return autograd::GradList{g[0]};
  });
}

TEST(SplitGradJoin, AdjacentViewsOfOneBufferBecomeTheGradientWithoutACopy) {
  Tensor x = zeros({4, 9}, {.dtype = DType::f64});  // (T, 3C) like the fused q/k/v projection
  x.set_requires_grad(true);
  auto seen = std::make_shared<Tensor>();
  const std::vector<Tensor> parts = split(probe(x, seen), std::vector<int64_t>{3, 3, 3}, -1);
  const Tensor packed = iota({4, 9});  // (T, 3C): dq | dk | dv side by side
  backward(sink(parts, [packed] {
    return autograd::GradList{raw::narrow(packed, 1, 0, 3), raw::narrow(packed, 1, 3, 3), raw::narrow(packed, 1, 6, 3)};
  }));
  ASSERT_TRUE(x.grad().defined());
  ASSERT_TRUE(seen->defined());
  EXPECT_EQ(seen->storage(), packed.storage());  // split handed on the packed buffer itself, no cat
  EXPECT_EQ(x.grad().to_vector<double>(), packed.to_vector<double>());
}

TEST(SplitGradJoin, ViewsOutOfOrderAreCopiedWithTheSameValues) {
  Tensor x = zeros({2, 6}, {.dtype = DType::f64});
  x.set_requires_grad(true);
  const std::vector<Tensor> parts = split(x, std::vector<int64_t>{2, 4}, -1);
  const Tensor packed = iota({2, 6});  // holds the second piece's gradient first
  backward(sink(parts, [packed] {
    return autograd::GradList{raw::narrow(packed, 1, 4, 2), raw::narrow(packed, 1, 0, 4)};
  }));
  ASSERT_TRUE(x.grad().defined());
  EXPECT_NE(x.grad().storage(), packed.storage());
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{4, 5, 0, 1, 2, 3, 10, 11, 6, 7, 8, 9}));
}

TEST(SplitGradJoin, SeparateOrPartlyMissingGradientsAreJoinedByCopy) {
  Tensor x = zeros({2, 4}, {.dtype = DType::f64});
  x.set_requires_grad(true);
  const std::vector<Tensor> parts = split(x, std::vector<int64_t>{2, 2}, -1);
  const Tensor packed = iota({2, 4});
  // Only the first piece gets a gradient: the second counts as zero even though packed holds values there.
  backward(sink(parts, [packed] { return autograd::GradList{raw::narrow(packed, 1, 0, 2), Tensor()}; }));
  ASSERT_TRUE(x.grad().defined());
  EXPECT_NE(x.grad().storage(), packed.storage());
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{0, 1, 0, 0, 4, 5, 0, 0}));
}

TEST(SplitGradJoin, AdjacentViewsThatDoNotTileTheWholeAreCopied) {
  // Pieces side by side in a wider buffer (row stride 6 for a (2, 4) input): the joined view would not
  // be contiguous, so the gradient is a fresh copy.
  Tensor x = zeros({2, 4}, {.dtype = DType::f64});
  x.set_requires_grad(true);
  const std::vector<Tensor> parts = split(x, std::vector<int64_t>{2, 2}, -1);
  const Tensor wide = iota({2, 6});
  backward(sink(parts, [wide] { return autograd::GradList{raw::narrow(wide, 1, 0, 2), raw::narrow(wide, 1, 2, 2)}; }));
  ASSERT_TRUE(x.grad().defined());
  EXPECT_NE(x.grad().storage(), wide.storage());
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{0, 1, 2, 3, 6, 7, 8, 9}));
}

}  // namespace
}  // namespace cpf
