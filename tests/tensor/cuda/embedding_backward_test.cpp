// The device embedding gradient (framework/tensor/cuda/embedding_backward.cu: ids sorted on the device,
// frequent ids in segments of kEmbeddingSegment rows) against the CPU's, bit for bit, at GPT-2 scale and
// at the copy task's few-id scale, around the segment length, and the same bits on every run.
// Text-like ids: a few very frequent ids (long runs: the padding / end-of-text case) among many rare
// ones, most of the vocabulary unused.
#include "cuda_test_utils.h"
#include "framework/tensor/ops/embedding.h"
#include "framework/tensor/ops/embedding_segment.h"
#include "framework/tensor/ops/views.h"

namespace cpf {
namespace {

using testing::on_cpu;
using testing::on_gpu;
using testing::random_cpu;

class CudaEmbeddingBackwardTest : public testing::CudaTest {};

// n ids in [0, rows): every 4th is one of 3 frequent ids, the rest spread over the table.
Tensor text_like_ids(int64_t n, int64_t rows, DType dtype) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i % 4 == 0 ? (i / 4) % 3 : (i * 7919 + 13) % rows;
  return raw::to(from_vector(v, {n}), dtype);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         raw::to(a, DType::f64).to_vector<double>() == raw::to(b, DType::f64).to_vector<double>();
}

TEST_F(CudaEmbeddingBackwardTest, Gpt2ScaleMatchesTheCpuBitForBit) {
  const int64_t rows = 50304, cols = 768, n = 4096;
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (DType id_dtype : {DType::i32, DType::i64}) {
      const Tensor ids = text_like_ids(n, rows, id_dtype);
      const Tensor grad = random_cpu({n, cols}, dtype, 81);
      const Tensor expected = raw::embedding_backward(grad, ids, rows);
      const Tensor got = on_cpu(raw::embedding_backward(on_gpu(grad), on_gpu(ids), rows));
      EXPECT_TRUE(same_bits(got, expected)) << dtype_name(dtype) << " ids " << dtype_name(id_dtype);
    }
  }
}

TEST_F(CudaEmbeddingBackwardTest, OneIdRepeatedThousandsOfTimesKeepsTheCpuOrder) {
  // One run of 3000 equal ids (many times the kernel's look-ahead) and a handful of others; f64 too.
  std::vector<int64_t> v(3100, 5);
  for (size_t i = 0; i < 100; ++i) v[i * 31] = static_cast<int64_t>(i % 9);
  const Tensor ids = from_vector(v, {31, 100});
  for (DType dtype : {DType::f32, DType::f64}) {
    const Tensor grad = random_cpu({31, 100, 40}, dtype, 82, -1e3, 1e3);  // large terms: order matters
    EXPECT_TRUE(
        same_bits(on_cpu(raw::embedding_backward(on_gpu(grad), on_gpu(ids), 9)), raw::embedding_backward(grad, ids, 9)))
        << dtype_name(dtype);
  }
}

TEST_F(CudaEmbeddingBackwardTest, RunLengthsAroundTheSegmentMatchTheCpuBitForBit) {
  // Runs of 1, S - 1, S, S + 1, 2S, 2S + 1 and 5S + 3 rows (S = kEmbeddingSegment), interleaved in
  // position order, so long and short runs meet at every offset of the partial slots' tiles.
  const int64_t s = raw::kEmbeddingSegment;
  const std::vector<int64_t> lengths{1, s - 1, s, s + 1, 2 * s, 2 * s + 1, 5 * s + 3};
  std::vector<int64_t> v;
  for (int64_t round = 0; round < 5 * s + 3; ++round) {
    for (size_t id = 0; id < lengths.size(); ++id) {
      if (round < lengths[id]) v.push_back(static_cast<int64_t>(id) * 3);  // ids 0, 3, ..., 18 of 20 rows
    }
  }
  const auto n = static_cast<int64_t>(v.size());
  const Tensor ids = from_vector(v, {n});
  for (DType dtype : {DType::f64, DType::f32, DType::bf16}) {
    const Tensor grad = random_cpu({n, 300}, dtype, 85, -1e3, 1e3);  // 300 columns: two column blocks
    EXPECT_TRUE(same_bits(on_cpu(raw::embedding_backward(on_gpu(grad), on_gpu(ids), 20)),
                          raw::embedding_backward(grad, ids, 20)))
        << dtype_name(dtype);
  }
}

TEST_F(CudaEmbeddingBackwardTest, CopyTaskScaleFewIdsMatchesTheCpuBitForBit) {
  // The synthetic copy task's batch: 32768 tokens over 14 ids (runs of ~2300 rows), 768 columns.
  const int64_t n = 32768, cols = 768, rows = 50304;
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = 100 + (i * 5 + i / 7) % 14;
  const Tensor ids = from_vector(v, {n});
  for (DType dtype : {DType::f32, DType::bf16}) {
    const Tensor grad = random_cpu({n, cols}, dtype, 86);
    EXPECT_TRUE(same_bits(on_cpu(raw::embedding_backward(on_gpu(grad), on_gpu(ids), rows)),
                          raw::embedding_backward(grad, ids, rows)))
        << dtype_name(dtype);
  }
}

TEST_F(CudaEmbeddingBackwardTest, SameBitsOnEveryRun) {
  const Tensor ids = on_gpu(text_like_ids(8192, 32000, DType::i64));
  const Tensor grad = on_gpu(random_cpu({8192, 256}, DType::bf16, 83));
  const Tensor first = on_cpu(raw::embedding_backward(grad, ids, 32000));
  for (int run = 0; run < 3; ++run) {
    EXPECT_TRUE(same_bits(on_cpu(raw::embedding_backward(grad, ids, 32000)), first)) << "run " << run;
  }
}

TEST_F(CudaEmbeddingBackwardTest, StridedGradAndUnusedRowsAndEmptyIds) {
  // A non-contiguous grad (a column slice) is made contiguous first; rows no id names are 0.
  const Tensor wide = random_cpu({64, 48}, DType::f32, 84);
  const Tensor grad = raw::narrow(wide, 1, 8, 32);
  const Tensor ids = text_like_ids(64, 1000, DType::i64);
  EXPECT_TRUE(same_bits(on_cpu(raw::embedding_backward(raw::narrow(on_gpu(wide), 1, 8, 32), on_gpu(ids), 1000)),
                        raw::embedding_backward(grad, ids, 1000)));
  const Tensor none = on_gpu(zeros({0}, {.dtype = DType::i32}));
  EXPECT_TRUE(same_bits(on_cpu(raw::embedding_backward(on_gpu(zeros({0, 8})), none, 4)), zeros({4, 8})));
}

TEST_F(CudaEmbeddingBackwardTest, AnOutOfRangeIdIsReportedWithTheCpuMessage) {
  const Tensor bad = on_gpu(from_vector<int32_t>({2, 0, -1, 3}, {2, 2}));
  EXPECT_CPF_ERROR(on_cpu(raw::embedding_backward(on_gpu(zeros({2, 2, 4})), bad, 4)),
                   "embedding_backward: id -1 at position [1,0] of ids [2,2] is out of range for a table of V=4 rows");
}

}  // namespace
}  // namespace cpf
