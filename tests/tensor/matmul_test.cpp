// raw::matmul against a naive triple loop: batch broadcasting, 1-D operands, every operand layout
// (transposed, sliced, stepped, expanded), zero-size dims, the threaded paths, bf16, errors.
#include "framework/tensor/ops/matmul.h"

#include <gtest/gtest.h>

#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/views.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

using testing::all_close;
using testing::random_tensor;

// numpy matmul semantics in plain loops, in double.
Tensor naive_matmul(const Tensor& a_in, const Tensor& b_in) {
  Shape as = a_in.shape(), bs = b_in.shape();
  const bool a_vec = as.size() == 1, b_vec = bs.size() == 1;
  if (a_vec) as.insert(as.begin(), 1);
  if (b_vec) bs.push_back(1);
  const int64_t m = as[as.size() - 2], k = as.back(), n = bs.back();
  const Shape a_batch(as.begin(), as.end() - 2), b_batch(bs.begin(), bs.end() - 2);
  const size_t nb = std::max(a_batch.size(), b_batch.size());
  Shape batch(nb);
  for (size_t i = 0; i < nb; ++i) {
    const int64_t da = i + a_batch.size() >= nb ? a_batch[i + a_batch.size() - nb] : 1;
    const int64_t db = i + b_batch.size() >= nb ? b_batch[i + b_batch.size() - nb] : 1;
    batch[i] = da == 1 ? db : da;
  }
  auto batch_index = [&](int64_t flat, const Shape& own) {
    int64_t index = 0, scale = 1;
    for (int64_t d = static_cast<int64_t>(nb) - 1; d >= 0; --d) {
      const int64_t coord = flat % batch[d];
      flat /= batch[d];
      const int64_t od = d - static_cast<int64_t>(nb - own.size());
      if (od < 0) continue;
      if (own[od] != 1) index += coord * scale;
      scale *= own[od];
    }
    return index;
  };
  const auto av = a_in.to_vector<double>(), bv = b_in.to_vector<double>();
  const int64_t batches = shape_numel(batch);
  std::vector<double> out(static_cast<size_t>(batches * m * n), 0.0);
  for (int64_t bi = 0; bi < batches; ++bi) {
    const int64_t ao = batch_index(bi, a_batch) * m * k, bo = batch_index(bi, b_batch) * k * n;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t p = 0; p < k; ++p) acc += av[ao + i * k + p] * bv[bo + p * n + j];
        out[(bi * m + i) * n + j] = acc;
      }
  }
  Shape out_shape = batch;
  if (!a_vec) out_shape.push_back(m);
  if (!b_vec) out_shape.push_back(n);
  return from_vector<double>(out, out_shape);
}

void expect_matmul(const Tensor& a, const Tensor& b, double tol) {
  SCOPED_TRACE("a " + shape_str(a.shape()) + " strides " + shape_str(a.strides()) + ", b " + shape_str(b.shape()) +
               " strides " + shape_str(b.strides()) + ", " + dtype_name(a.dtype()));
  Tensor c = raw::matmul(a, b);
  Tensor ref = naive_matmul(a, b);
  EXPECT_EQ(c.dtype(), a.dtype());
  ASSERT_EQ(c.shape(), ref.shape());
  EXPECT_TRUE(all_close(c, ref, tol, tol));
}

TEST(Matmul, ShapesAndBatchBroadcasting) {
  const std::vector<std::pair<Shape, Shape>> cases{
      {{4, 8}, {8, 3}},
      {{1, 5}, {5, 1}},
      {{3, 4, 8}, {8, 3}},
      {{4, 8}, {2, 8, 3}},
      {{2, 3, 4, 5}, {3, 5, 6}},
      {{2, 1, 4, 5}, {3, 5, 6}},
      {{1, 4, 5}, {3, 5, 2}},
      {{3, 1, 2, 4}, {1, 2, 4, 3}},
      {{8}, {8, 3}},
      {{4, 8}, {8}},
      {{8}, {8}},
      {{2, 3, 4}, {4}},
      {{4}, {2, 4, 5}},
      {{1}, {1, 7}},
      {{7, 1}, {1}},
  };
  for (DType dtype : {DType::f64, DType::f32}) {
    for (const auto& [sa, sb] : cases) {
      expect_matmul(random_tensor(sa, dtype, 1), random_tensor(sb, dtype, 2), dtype == DType::f64 ? 1e-13 : 1e-5);
    }
  }
  EXPECT_EQ(raw::matmul(random_tensor({8}), random_tensor({8})).dim(), 0);
  EXPECT_EQ(raw::matmul(random_tensor({2, 3, 4}), random_tensor({4})).shape(), (Shape{2, 3}));
  EXPECT_EQ(raw::matmul(random_tensor({4}), random_tensor({2, 4, 5})).shape(), (Shape{2, 5}));
}

TEST(Matmul, BFloat16IsComputedInF32) {
  Tensor a = random_tensor({3, 16, 32}, DType::bf16, 3);
  Tensor b = random_tensor({32, 8}, DType::bf16, 4);
  Tensor c = raw::matmul(a, b);
  EXPECT_EQ(c.dtype(), DType::bf16);
  // Reference from the same bf16 values, so only the output rounding differs (2^-9 relative).
  EXPECT_TRUE(all_close(c, naive_matmul(a, b), 2e-2, 1e-2));
}

TEST(Matmul, EveryOperandLayout) {
  // Each layout of a (4, 6) left operand and a (6, 5) right operand, combined.
  Tensor a_base = random_tensor({6, 9}, DType::f64, 5);
  Tensor b_base = random_tensor({10, 12}, DType::f64, 6);
  const std::vector<Tensor> lefts{
      random_tensor({4, 6}, DType::f64, 7),                             // contiguous
      raw::transpose(random_tensor({6, 4}, DType::f64, 8), 0, 1),       // column-major
      raw::narrow(raw::narrow(a_base, 1, 2, 6), 0, 1, 4),               // row stride 9 > cols
      raw::slice(random_tensor({4, 12}, DType::f64, 36), 1, 0, 12, 2),  // column stride 2: copied first
      raw::expand(random_tensor({1, 6}, DType::f64, 9), {4, 6}),        // row stride 0
      raw::expand(random_tensor({4, 1}, DType::f64, 10), {4, 6}),       // column stride 0
      raw::transpose(raw::narrow(a_base, 1, 0, 4), 0, 1),               // transposed slice
  };
  const std::vector<Tensor> rights{
      random_tensor({6, 5}, DType::f64, 11),
      raw::transpose(random_tensor({5, 6}, DType::f64, 12), 0, 1),
      raw::narrow(raw::narrow(b_base, 0, 3, 6), 1, 4, 5),
      raw::slice(raw::narrow(b_base, 0, 0, 6), 1, 1, 11, 2),
      raw::expand(random_tensor({6, 1}, DType::f64, 13), {6, 5}),
      raw::expand(random_tensor({1, 5}, DType::f64, 14), {6, 5}),
      raw::expand(scalar_tensor(0.5, {.dtype = DType::f64}), {6, 5}),
  };
  for (const Tensor& a : lefts) {
    ASSERT_EQ(a.shape(), (Shape{4, 6}));
    for (const Tensor& b : rights) {
      ASSERT_EQ(b.shape(), (Shape{6, 5}));
      expect_matmul(a, b, 1e-13);
    }
  }
}

TEST(Matmul, DegenerateVectorsWithOddStrides) {
  // Single rows/columns whose only stride is 0 or > 1 (broadcast or stepped vectors).
  Tensor base = random_tensor({4, 10}, DType::f64, 15);
  const std::vector<Tensor> vectors{
      raw::expand(scalar_tensor(1.5, {.dtype = DType::f64}), {5}),  // stride 0
      raw::slice(raw::select(base, 0, 1), 0, 0, 10, 2),             // stride 2
  };
  Tensor m = random_tensor({5, 3}, DType::f64, 16);
  Tensor mt = random_tensor({3, 5}, DType::f64, 17);
  for (const Tensor& v : vectors) {
    expect_matmul(v, m, 1e-13);                      // (5,) @ (5, 3)
    expect_matmul(mt, v, 1e-13);                     // (3, 5) @ (5,)
    expect_matmul(raw::unsqueeze(v, 0), m, 1e-13);   // (1, 5) @ (5, 3)
    expect_matmul(mt, raw::unsqueeze(v, 1), 1e-13);  // (3, 5) @ (5, 1)
    expect_matmul(v, v, 1e-13);                      // dot
  }
  Tensor col = raw::select(base, 1, 3);  // (4,) stride 10
  expect_matmul(random_tensor({2, 4}, DType::f64, 18), raw::unsqueeze(col, 1), 1e-13);
  expect_matmul(raw::unsqueeze(col, 0), random_tensor({4, 3}, DType::f64, 19), 1e-13);
  // A (4, 1) column expanded from one element: both strides 0.
  expect_matmul(random_tensor({3, 4}, DType::f64, 20), raw::expand(scalar_tensor(2.0, {.dtype = DType::f64}), {4, 1}),
                1e-13);
  expect_matmul(raw::expand(scalar_tensor(2.0, {.dtype = DType::f64}), {1, 4}), random_tensor({4, 2}, DType::f64, 21),
                1e-13);
}

TEST(Matmul, BatchedLayouts) {
  // Batch dims that are expanded (stride 0), permuted, or broadcast from size 1.
  Tensor w = random_tensor({5, 7}, DType::f64, 22);
  expect_matmul(random_tensor({3, 4, 5}, DType::f64, 23), raw::expand(w, {3, 5, 7}), 1e-13);
  Tensor x = raw::permute(random_tensor({4, 3, 5}, DType::f64, 24), {1, 0, 2});  // (3, 4, 5), batch stride 5
  expect_matmul(x, w, 1e-13);
  expect_matmul(x, raw::transpose(random_tensor({3, 7, 5}, DType::f64, 25), 1, 2), 1e-13);
  expect_matmul(raw::transpose(random_tensor({2, 1, 5, 4}, DType::f64, 26), 2, 3),
                random_tensor({3, 5, 2}, DType::f64, 27), 1e-13);
}

TEST(Matmul, ZeroSizeDims) {
  Tensor c = raw::matmul(random_tensor({3, 0}, DType::f64, 28), random_tensor({0, 4}, DType::f64, 29));
  EXPECT_EQ(c.shape(), (Shape{3, 4}));
  EXPECT_EQ(c.to_vector<double>(), std::vector<double>(12, 0.0)) << "an empty sum is 0";
  EXPECT_EQ(raw::matmul(random_tensor({2, 3, 0}), random_tensor({0, 4})).to_vector<float>(),
            std::vector<float>(24, 0.0f));
  EXPECT_EQ(raw::matmul(random_tensor({0}), random_tensor({0})).item<float>(), 0.0f);
  EXPECT_EQ(raw::matmul(random_tensor({0, 3}), random_tensor({3, 4})).shape(), (Shape{0, 4}));
  EXPECT_EQ(raw::matmul(random_tensor({3, 5}), random_tensor({5, 0})).shape(), (Shape{3, 0}));
  EXPECT_EQ(raw::matmul(random_tensor({0, 3, 5}), random_tensor({5, 2})).shape(), (Shape{0, 3, 2}));
}

TEST(Matmul, LargeAndManyBatches) {
  // One large GEMM (Eigen threads it) and many small ones (one per OpenMP thread).
  Tensor a = random_tensor({160, 130}, DType::f32, 30);
  Tensor b = raw::transpose(random_tensor({140, 130}, DType::f32, 31), 0, 1);
  expect_matmul(a, b, 1e-4);
  expect_matmul(random_tensor({64, 6, 7}, DType::f64, 32), random_tensor({64, 7, 5}, DType::f64, 33), 1e-13);
  expect_matmul(random_tensor({33, 2, 7}, DType::f64, 34),
                raw::transpose(random_tensor({33, 5, 7}, DType::f64, 35), 1, 2), 1e-13);
}

TEST(Matmul, Errors) {
  EXPECT_CPF_ERROR(raw::matmul(zeros({4, 8}), zeros({6, 3})), "matmul: inner dimensions differ: a=[4,8] b=[6,3]");
  EXPECT_CPF_ERROR(raw::matmul(zeros({3}), zeros({4})), "matmul: inner dimensions differ: a=[3] b=[4]");
  EXPECT_CPF_ERROR(raw::matmul(zeros({2, 5, 3}), zeros({4})), "matmul: inner dimensions differ: a=[2,5,3] b=[4]");
  EXPECT_CPF_ERROR(raw::matmul(zeros({2, 4, 8}), zeros({3, 8, 2})),
                   "matmul: shapes [2] and [3] are not broadcastable (dim 0: 2 vs 3)");
  EXPECT_CPF_ERROR(raw::matmul(scalar_tensor(1.0), zeros({3})),
                   "matmul: operands must have at least one dim, got a=[] b=[3]");
  EXPECT_CPF_ERROR(raw::matmul(zeros({2, 2}), zeros({2, 2}, {.dtype = DType::f64})),
                   "matmul: dtypes differ: f32 [2,2] vs f64 [2,2]");
  EXPECT_CPF_ERROR(raw::matmul(zeros({2, 2}, {.dtype = DType::i64}), zeros({2, 2}, {.dtype = DType::i64})),
                   "matmul: needs floating tensors, got i64");
  EXPECT_CPF_ERROR(raw::matmul(Tensor(), zeros({2})), "matmul: argument 'a' is an undefined tensor");
  EXPECT_CPF_ERROR(raw::matmul(zeros({2}), Tensor()), "matmul: argument 'b' is an undefined tensor");
}

}  // namespace
}  // namespace cpf
