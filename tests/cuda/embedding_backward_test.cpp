// The device embedding gradient (framework/tensor/cuda/embedding_backward.cu: ids sorted on the device,
// one block per run of equal ids) against the CPU's, bit for bit, at GPT-2 scale, and the same bits
// on every run. Text-like ids: a few very frequent ids (long runs: the padding / end-of-text case)
// among many rare ones, most of the vocabulary unused.
#include "cuda_test_utils.h"
#include "framework/tensor/ops/embedding.h"
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

TEST_F(CudaEmbeddingBackwardTest, OneIdRepeatedThousandsOfTimesKeepsThePositionOrder) {
  // One run of 3000 equal ids (many times the kernel's look-ahead) and a handful of others; f64 too.
  std::vector<int64_t> v(3100, 5);
  for (size_t i = 0; i < 100; ++i) v[i * 31] = static_cast<int64_t>(i % 9);
  const Tensor ids = from_vector(v, {31, 100});
  for (DType dtype : {DType::f32, DType::f64}) {
    const Tensor grad = random_cpu({31, 100, 40}, dtype, 82, -1e3, 1e3);  // large terms: order matters
    EXPECT_TRUE(same_bits(on_cpu(raw::embedding_backward(on_gpu(grad), on_gpu(ids), 9)),
                          raw::embedding_backward(grad, ids, 9)))
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
