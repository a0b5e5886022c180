// Embedding, index_select / gather / scatter_add / index_add_ / index_copy_, masked_fill and cat / stack / split on
// the GPU against the CPU ops. Gathers and copies move bits, so they must match exactly. The
// accumulating ops add every destination's terms in index-position order on both sides (no atomics
// on the GPU), so f32 results are bit-identical to the CPU's too, and bf16 (accumulated in f32,
// rounded once) as well.
#include "framework/tensor/ops/index.h"
#include "cuda_test_utils.h"
#include "framework/tensor/ops/embedding.h"
#include "framework/tensor/ops/join.h"
#include "framework/tensor/ops/views.h"

namespace cpf {
namespace {

using testing::all_close;
using testing::on_cpu;
using testing::on_gpu;
using testing::random_cpu;

class CudaIndexTest : public testing::CudaTest {};

// Ids in [0, rows) with many repeats (so gradients accumulate several terms per row).
Tensor ids_tensor(const Shape& shape, int64_t rows, DType dtype, int64_t salt) {
  std::vector<int64_t> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = (static_cast<int64_t>(i) * 7 + salt * (static_cast<int64_t>(i) % 3)) % rows;
  }
  return raw::to(from_vector(v, shape), dtype);
}

TEST_F(CudaIndexTest, EmbeddingForwardAndBackwardMatchTheCpuExactly) {
  for (DType dtype : {DType::f32, DType::f64, DType::bf16}) {
    for (DType id_dtype : {DType::i32, DType::i64}) {
      const std::string what = dtype_name(dtype) + " ids " + dtype_name(id_dtype);
      Tensor weight = random_cpu({50, 24}, dtype, 71);
      Tensor ids = ids_tensor({4, 33}, 50, id_dtype, 5);
      Tensor out = raw::embedding(on_gpu(weight), on_gpu(ids));
      EXPECT_EQ(out.shape(), (Shape{4, 33, 24}));
      EXPECT_TRUE(all_close(on_cpu(out), raw::embedding(weight, ids), 0, 0)) << what;
      Tensor grad = random_cpu({4, 33, 24}, dtype, 72);
      Tensor dw = raw::embedding_backward(on_gpu(grad), on_gpu(ids), 60);  // 10 rows nobody uses
      EXPECT_EQ(dw.dtype(), dtype);
      EXPECT_TRUE(all_close(on_cpu(dw), raw::embedding_backward(grad, ids, 60), 0, 0)) << what;
    }
  }
  // A row-sliced table (stride(0) > C) and empty ids.
  Tensor big = random_cpu({10, 16}, DType::f32, 73);
  Tensor part = raw::narrow(big, 1, 4, 8);
  Tensor ids = from_vector<int64_t>({3, 0, 9, 3}, {4});
  EXPECT_TRUE(all_close(on_cpu(raw::embedding(raw::narrow(on_gpu(big), 1, 4, 8), on_gpu(ids))),
                        raw::embedding(part, ids), 0, 0));
  Tensor none = on_gpu(zeros({0}, {.dtype = DType::i64}));
  EXPECT_EQ(raw::embedding(on_gpu(big), none).shape(), (Shape{0, 16}));
  EXPECT_TRUE(all_close(on_cpu(raw::embedding_backward(on_gpu(zeros({0, 16})), none, 3)), zeros({3, 16}), 0, 0));
  // The device bucketing (atomics, then a rank sort per row) with one very frequent row (3072 of 4096
  // positions, as a padding id would be) and a long table: summed in position order, bit for bit.
  std::vector<int64_t> many(4096);
  for (size_t i = 0; i < many.size(); ++i) many[i] = i % 4 == 3 ? static_cast<int64_t>(i * 31 % 50000) : 7;
  Tensor many_ids = from_vector(many, {2, 2048});
  Tensor many_grad = random_cpu({2, 2048, 16}, DType::f32, 75);
  EXPECT_TRUE(all_close(on_cpu(raw::embedding_backward(on_gpu(many_grad), on_gpu(many_ids), 50000)),
                        raw::embedding_backward(many_grad, many_ids, 50000), 0, 0));
}

TEST_F(CudaIndexTest, EmbeddingErrors) {
  Tensor weight = on_gpu(random_cpu({5, 4}, DType::f32, 74));
  Tensor bad = on_gpu(from_vector<int64_t>({1, 5, 2}, {3}));
  EXPECT_CPF_ERROR(on_cpu(raw::embedding(weight, bad)), "embedding: id 5 at position [1] of ids [3] is out of range");
  EXPECT_CPF_ERROR(on_cpu(raw::embedding_backward(on_gpu(zeros({3, 4})), bad, 5)),
                   "embedding_backward: id 5 at position [1] of ids [3] is out of range");
  Tensor host_ids = from_vector<int64_t>({1}, {1});
  EXPECT_CPF_ERROR(raw::embedding(weight, host_ids), "embedding: tensors are on different devices: cuda:0 vs cpu");
  EXPECT_CPF_ERROR(raw::embedding_backward(on_gpu(zeros({1, 4})), host_ids, 5),
                   "embedding_backward: tensors are on different devices: cuda:0 vs cpu");
}

TEST_F(CudaIndexTest, IndexSelectAndGatherMatchTheCpu) {
  for (DType dtype : {DType::f32, DType::bf16, DType::i64, DType::boolean}) {
    Tensor x = raw::to(random_cpu({6, 5, 4}, DType::f32, 75, -3, 3), dtype);
    Tensor gx = on_gpu(x);
    for (int64_t dim : {0, 1, 2}) {
      const std::string what = dtype_name(dtype) + " dim " + std::to_string(dim);
      Tensor index = ids_tensor({7}, x.size(dim), DType::i32, 2);
      EXPECT_TRUE(all_close(on_cpu(raw::index_select(gx, dim, on_gpu(index))), raw::index_select(x, dim, index), 0, 0))
          << "index_select " << what;
      Shape ishape = x.shape();
      ishape[dim] = 3;
      Tensor gindex = ids_tensor(ishape, x.size(dim), DType::i64, 1);
      EXPECT_TRUE(all_close(on_cpu(raw::gather(gx, dim, on_gpu(gindex))), raw::gather(x, dim, gindex), 0, 0))
          << "gather " << what;
    }
    // Strided input (a transposed view).
    Tensor index = from_vector<int64_t>({4, 0, 4, 2}, {4});
    EXPECT_TRUE(all_close(on_cpu(raw::index_select(raw::transpose(gx, 0, 2), 2, on_gpu(index))),
                          raw::index_select(raw::transpose(x, 0, 2), 2, index), 0, 0));
  }
  EXPECT_CPF_ERROR(on_cpu(raw::index_select(on_gpu(zeros({3, 2})), 0, on_gpu(from_vector<int64_t>({0, 3}, {2})))),
                   "index_select: index 3 at position [1] is out of range for dim 0 of size 3");
  EXPECT_EQ(raw::index_select(on_gpu(zeros({3, 2})), 0, on_gpu(zeros({0}, {.dtype = DType::i64}))).shape(),
            (Shape{0, 2}));
}

TEST_F(CudaIndexTest, ScatterAddAndIndexAddMatchTheCpuExactly) {
  for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::i64, DType::i32}) {
    const std::string what = dtype_name(dtype);
    Tensor x = raw::to(random_cpu({6, 5, 4}, DType::f32, 76, -9, 9), dtype);
    for (int64_t dim : {0, 1, 2}) {
      Shape ishape = x.shape();
      ishape[dim] = 9;  // more sources than destinations: repeated indices accumulate
      Tensor index = ids_tensor(ishape, x.size(dim), DType::i64, 3);
      Tensor src = raw::to(random_cpu(ishape, DType::f32, 77, -9, 9), dtype);
      EXPECT_TRUE(all_close(on_cpu(raw::scatter_add(on_gpu(x), dim, on_gpu(index), on_gpu(src))),
                            raw::scatter_add(x, dim, index, src), 0, 0))
          << "scatter_add " << what << " dim " << dim;
      Tensor dst = raw::clone(x);
      Tensor gdst = on_gpu(x);
      raw::scatter_add_(dst, dim, index, src);
      raw::scatter_add_(gdst, dim, on_gpu(index), on_gpu(src));
      EXPECT_TRUE(all_close(on_cpu(gdst), dst, 0, 0)) << "scatter_add_ " << what << " dim " << dim;

      Tensor index1 = ids_tensor({9}, x.size(dim), DType::i32, 4);
      Tensor adst = raw::clone(x);
      Tensor gadst = on_gpu(x);
      raw::index_add_(adst, dim, index1, src);
      raw::index_add_(gadst, dim, on_gpu(index1), on_gpu(src));
      EXPECT_TRUE(all_close(on_cpu(gadst), adst, 0, 0)) << "index_add_ " << what << " dim " << dim;
    }
  }
  // Into a strided destination (a transposed view), in place.
  Tensor base = random_cpu({4, 6}, DType::f32, 78);
  Tensor gbase = on_gpu(base);
  Tensor index = from_vector<int64_t>({1, 1, 0, 3, 1}, {5});
  Tensor src = random_cpu({6, 5}, DType::f32, 79);
  raw::index_add_(raw::transpose(base, 0, 1), 1, index, src);
  raw::index_add_(raw::transpose(gbase, 0, 1), 1, on_gpu(index), on_gpu(src));
  EXPECT_TRUE(all_close(on_cpu(gbase), base, 0, 0));
  // Checked on the device: raised by the next synchronisation, with the CPU's message.
  EXPECT_CPF_ERROR(
      {
        raw::scatter_add_(on_gpu(zeros({2, 2})), 0, on_gpu(from_vector<int64_t>({0, 2, 1, 1}, {2, 2})),
                          on_gpu(zeros({2, 2})));
        cuda::synchronize();
      },
      "scatter_add_: index 2 at position [0,1] is out of range for dim 0 of size 2");
}

TEST_F(CudaIndexTest, IndexCopyMatchesTheCpuExactly) {
  for (DType dtype : {DType::f32, DType::bf16, DType::i64, DType::f64}) {
    for (DType index_dtype : {DType::i32, DType::i64}) {
      // A KV-cache-like write (rows of (H, D)) and a strided write along dim 1; repeats keep the last row.
      Tensor cache = raw::to(random_cpu({9, 3, 8}, DType::f32, 85, -4, 4), dtype);
      Tensor gcache = on_gpu(cache);
      const Tensor rows = raw::to(from_vector<int64_t>({4, 0, 4, 8}, {4}), index_dtype);
      const Tensor src = raw::to(random_cpu({4, 3, 8}, DType::f32, 86, -4, 4), dtype);
      raw::index_copy_(cache, 0, rows, src);
      raw::index_copy_(gcache, 0, on_gpu(rows), on_gpu(src));
      EXPECT_TRUE(all_close(on_cpu(gcache), cache, 0, 0)) << dtype_name(dtype);
      const Tensor cols = raw::to(from_vector<int64_t>({2, 1}, {2}), index_dtype);
      const Tensor part = raw::to(random_cpu({9, 2, 8}, DType::f32, 87, -4, 4), dtype);
      raw::index_copy_(raw::transpose(cache, 1, 2), 2, cols, raw::transpose(part, 1, 2));
      raw::index_copy_(raw::transpose(gcache, 1, 2), 2, on_gpu(cols), on_gpu(raw::transpose(part, 1, 2)));
      EXPECT_TRUE(all_close(on_cpu(gcache), cache, 0, 0)) << dtype_name(dtype);
    }
  }
  EXPECT_CPF_ERROR(
      {
        raw::index_copy_(on_gpu(zeros({2, 2})), 0, on_gpu(from_vector<int64_t>({1, 2}, {2})), on_gpu(zeros({2, 2})));
        cuda::synchronize();
      },
      "index_copy_: index 2 at position [1] is out of range for dim 0 of size 2");
}

TEST_F(CudaIndexTest, MaskedFillMatchesTheCpu) {
  for (DType dtype : {DType::f32, DType::bf16, DType::i64, DType::boolean}) {
    Tensor x = raw::to(random_cpu({5, 6}, DType::f32, 80, -3, 3), dtype);
    Tensor mask = raw::to(random_cpu({1, 6}, DType::f32, 81), DType::boolean);  // broadcast over rows
    const double value = dtype == DType::boolean ? 1.0 : (dtype == DType::i64 ? -7.0 : -1e9);
    EXPECT_TRUE(
        all_close(on_cpu(raw::masked_fill(on_gpu(x), on_gpu(mask), value)), raw::masked_fill(x, mask, value), 0, 0))
        << dtype_name(dtype);
  }
}

TEST_F(CudaIndexTest, CatStackAndSplitMatchTheCpu) {
  for (DType dtype : {DType::f32, DType::bf16, DType::i32}) {
    Tensor a = raw::to(random_cpu({3, 4, 5}, DType::f32, 82, -5, 5), dtype);
    Tensor b = raw::to(random_cpu({3, 2, 5}, DType::f32, 83, -5, 5), dtype);
    Tensor c = raw::to(random_cpu({3, 4, 5}, DType::f32, 84, -5, 5), dtype);
    EXPECT_TRUE(all_close(on_cpu(raw::cat({on_gpu(a), on_gpu(b)}, 1)), raw::cat({a, b}, 1), 0, 0));
    EXPECT_TRUE(all_close(on_cpu(raw::cat({on_gpu(a), on_gpu(c)}, -1)), raw::cat({a, c}, -1), 0, 0));
    EXPECT_TRUE(all_close(on_cpu(raw::stack({on_gpu(a), on_gpu(c)}, 2)), raw::stack({a, c}, 2), 0, 0));
    // Split views of a device tensor, joined back after a transpose (strided sources).
    const auto pieces = raw::split(raw::transpose(on_gpu(a), 0, 2), std::vector<int64_t>{2, 3}, 0);
    const auto ref = raw::split(raw::transpose(a, 0, 2), std::vector<int64_t>{2, 3}, 0);
    ASSERT_EQ(pieces.size(), 2u);
    EXPECT_EQ(pieces[1].device(), Device::cuda(0));
    EXPECT_TRUE(all_close(on_cpu(raw::cat({pieces[1], pieces[0]}, 0)), raw::cat({ref[1], ref[0]}, 0), 0, 0));
  }
}

}  // namespace
}  // namespace cpf
