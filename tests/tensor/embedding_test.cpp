#include "framework/tensor/ops/embedding.h"

#include <gtest/gtest.h>

#if defined(CPF_WITH_OPENMP)
#include <omp.h>
#endif

#include "framework/tensor/ops/views.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

using testing::all_close;
using testing::random_tensor;

Tensor reference_embedding(const Tensor& weight, const Tensor& ids) {
  const int64_t cols = weight.size(1);
  const auto w = weight.to_vector<double>();
  const auto id = ids.to_vector<int64_t>();
  std::vector<double> out;
  for (int64_t v : id) {
    for (int64_t c = 0; c < cols; ++c) out.push_back(w[v * cols + c]);
  }
  Shape shape = ids.shape();
  shape.push_back(cols);
  return from_vector(out, shape);
}

Tensor reference_backward(const Tensor& grad, const Tensor& ids, int64_t rows) {
  const int64_t cols = grad.size(-1);
  const auto g = grad.to_vector<double>();
  const auto id = ids.to_vector<int64_t>();
  std::vector<double> out(static_cast<size_t>(rows * cols), 0.0);
  for (size_t i = 0; i < id.size(); ++i) {
    for (int64_t c = 0; c < cols; ++c) out[id[i] * cols + c] += g[i * cols + c];
  }
  return from_vector(out, {rows, cols});
}

TEST(Embedding, ForwardCopiesRows) {
  for (DType dtype : {DType::f32, DType::f64, DType::bf16}) {
    const Tensor w = raw::to(random_tensor({10, 5}, DType::f32, 1), dtype);
    const Tensor ids64 = from_vector<int64_t>({3, 0, 9, 3, 7, 1}, {2, 3});
    const Tensor ids32 = from_vector<int32_t>({9, 9, 0, 4, 2, 5, 8}, {7});
    for (const Tensor& ids : {ids64, ids32}) {
      const Tensor out = raw::embedding(w, ids);
      EXPECT_EQ(out.dtype(), dtype);
      EXPECT_TRUE(all_close(out, reference_embedding(w, ids), 0, 0)) << dtype_name(dtype);
    }
  }
}

TEST(Embedding, ScalarAndEmptyIds) {
  const Tensor w = random_tensor({4, 3}, DType::f64, 2);
  const Tensor one = raw::embedding(w, full({}, 2, {.dtype = DType::i64}));
  EXPECT_EQ(one.shape(), (Shape{3}));
  EXPECT_TRUE(all_close(one, raw::select(w, 0, 2), 0, 0));
  EXPECT_EQ(raw::embedding(w, zeros({2, 0}, {.dtype = DType::i32})).shape(), (Shape{2, 0, 3}));
  const Tensor no_grad = zeros({0, 3}, {.dtype = DType::f64});
  EXPECT_TRUE(all_close(raw::embedding_backward(no_grad, zeros({0}, {.dtype = DType::i64}), 4),
                        zeros({4, 3}, {.dtype = DType::f64}), 0, 0));
}

TEST(Embedding, NonContiguousTableAndIds) {
  const Tensor table = random_tensor({6, 8}, DType::f32, 3);
  const Tensor sliced = raw::narrow(table, 1, 2, 4);  // (6, 4), row stride 8: used in place
  const Tensor transposed = raw::transpose(random_tensor({5, 6}, DType::f32, 4), 0, 1);       // (6, 5), copied
  const Tensor ids = raw::transpose(from_vector<int64_t>({0, 5, 2, 3, 1, 4}, {2, 3}), 0, 1);  // (3, 2)
  ASSERT_FALSE(sliced.is_contiguous());
  ASSERT_FALSE(ids.is_contiguous());
  EXPECT_TRUE(all_close(raw::embedding(sliced, ids), reference_embedding(sliced, ids), 0, 0));
  EXPECT_TRUE(all_close(raw::embedding(transposed, ids), reference_embedding(transposed, ids), 0, 0));
  const Tensor grad = raw::transpose(random_tensor({4, 2, 3}, DType::f64, 5), 0, 2);  // (3, 2, 4)
  EXPECT_TRUE(all_close(raw::embedding_backward(grad, ids, 6), reference_backward(grad, ids, 6), 1e-14, 0));
}

TEST(Embedding, LargeLookupsUseThreads) {
  const Tensor w = random_tensor({1000, 64}, DType::f32, 6);
  const Tensor ids = randint(0, 1000, {8, 512}, {.dtype = DType::i32});
  EXPECT_TRUE(all_close(raw::embedding(w, ids), reference_embedding(w, ids), 0, 0));
}

TEST(EmbeddingBackward, SumsRepeatedIds) {
  for (DType dtype : {DType::f32, DType::f64}) {
    const Tensor ids = from_vector<int64_t>({1, 4, 1, 1, 0, 4}, {3, 2});
    const Tensor grad = random_tensor({3, 2, 5}, dtype, 7);
    const Tensor d = raw::embedding_backward(grad, ids, 6);
    EXPECT_EQ(d.shape(), (Shape{6, 5}));
    EXPECT_EQ(d.dtype(), dtype);
    EXPECT_TRUE(all_close(d, reference_backward(grad, ids, 6), 1e-6, 1e-6));
    for (double v : raw::select(d, 0, 5).to_vector<double>()) EXPECT_EQ(v, 0.0);  // untouched rows are zero
  }
  const Tensor ids32 = from_vector<int32_t>({2, 2, 0}, {3});
  const Tensor gb = raw::to(random_tensor({3, 16}, DType::f32, 8), DType::bf16);
  const Tensor db = raw::embedding_backward(gb, ids32, 3);
  EXPECT_EQ(db.dtype(), DType::bf16);
  EXPECT_TRUE(all_close(db, reference_backward(gb, ids32, 3), 1e-2, 1e-2));
}

TEST(EmbeddingBackward, DeterministicAcrossThreadCounts) {
  // Many repeats of few ids in f32: any change of summation order would show in the low bits.
  const Tensor ids = randint(0, 7, {4096}, {.dtype = DType::i64});
  const Tensor grad = random_tensor({4096, 96}, DType::f32, 9);
  const auto first = raw::embedding_backward(grad, ids, 7).to_vector<float>();
  EXPECT_EQ(first, raw::embedding_backward(grad, ids, 7).to_vector<float>());
  EXPECT_TRUE(all_close(from_vector(first, {7, 96}), reference_backward(grad, ids, 7), 1e-4, 1e-5));
#if defined(CPF_WITH_OPENMP)
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto single = raw::embedding_backward(grad, ids, 7).to_vector<float>();
  omp_set_num_threads(std::max(saved, 3));
  const auto many = raw::embedding_backward(grad, ids, 7).to_vector<float>();
  omp_set_num_threads(saved);
  EXPECT_EQ(single, first);
  EXPECT_EQ(many, first);
#endif
}

TEST(Embedding, RejectsBadInputs) {
  const Tensor w = random_tensor({10, 4}, DType::f32);
  const Tensor ids = from_vector<int64_t>({1, 2}, {2});
  EXPECT_CPF_ERROR(raw::embedding(Tensor(), ids), "embedding: argument 'weight' is an undefined tensor");
  EXPECT_CPF_ERROR(raw::embedding(w, Tensor()), "embedding: argument 'ids' is an undefined tensor");
  EXPECT_CPF_ERROR(raw::embedding(random_tensor({10}, DType::f32), ids),
                   "embedding: weight must be 2-D (V, C), got shape [10]");
  EXPECT_CPF_ERROR(raw::embedding(zeros({10, 4}, {.dtype = DType::i64}), ids),
                   "embedding: weight must be a floating tensor, got i64");
  EXPECT_CPF_ERROR(raw::embedding(w, random_tensor({2}, DType::f32)), "embedding: ids must be i32 or i64, got f32");
  EXPECT_CPF_ERROR(raw::embedding(w, zeros({2}, {.dtype = DType::boolean})),
                   "embedding: ids must be i32 or i64, got bool");
  EXPECT_CPF_ERROR(raw::embedding(w, from_vector<int64_t>({1, 2, 3, 4, 12, 5}, {2, 3})),
                   "embedding: id 12 at position [1,1] of ids [2,3] is out of range for a table of V=10 rows "
                   "(expected 0..9)");
  EXPECT_CPF_ERROR(raw::embedding(w, from_vector<int32_t>({-1}, {1})),
                   "embedding: id -1 at position [0] of ids [1] is out of range for a table of V=10 rows");

  const Tensor grad = random_tensor({2, 4}, DType::f32);
  EXPECT_CPF_ERROR(raw::embedding_backward(Tensor(), ids, 10),
                   "embedding_backward: argument 'grad' is an undefined tensor");
  EXPECT_CPF_ERROR(raw::embedding_backward(zeros({2, 4}, {.dtype = DType::i32}), ids, 10),
                   "embedding_backward: grad must be a floating tensor, got i32");
  EXPECT_CPF_ERROR(raw::embedding_backward(grad, ids, -1), "embedding_backward: num_rows must be >= 0, got -1");
  EXPECT_CPF_ERROR(raw::embedding_backward(random_tensor({3, 4}, DType::f32), ids, 10),
                   "embedding_backward: grad of shape [3,4] must be ids' shape [2] followed by the embedding dim");
  EXPECT_CPF_ERROR(raw::embedding_backward(random_tensor({2}, DType::f32), ids, 10),
                   "embedding_backward: grad of shape [2] must be ids' shape [2] followed by the embedding dim");
  EXPECT_CPF_ERROR(raw::embedding_backward(grad, from_vector<int64_t>({0, 3}, {2}), 3),
                   "embedding_backward: id 3 at position [1] of ids [2] is out of range for a table of V=3 rows");
  EXPECT_CPF_ERROR(raw::embedding_backward(grad, random_tensor({2}, DType::f64), 3),
                   "embedding_backward: ids must be i32 or i64, got f64");
}

}  // namespace
}  // namespace cpf
