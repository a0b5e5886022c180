// The fused classifier on the GPU: raw::classifier_loss against the CPU reference for f32, bf16 and f64
// over every row-kernel variant (16-byte vectors or scalars, the row cached in shared memory or
// re-read), several chunkings (the dweight sum accumulated in place by the GEMM, f32 for bf16),
// ignored and i32 labels; a label out of range reported at the next synchronisation; and the peak
// memory of the fused path below the unfused one's by at least the logits' size.
#include <gtest/gtest.h>

#include "cuda_test_utils.h"
#include "framework/autograd/functions/classifier_loss.h"
#include "framework/autograd/ops.h"
#include "framework/tensor/ops/classifier_loss.h"

namespace cpf {
namespace {

using testing::all_close;
using testing::on_cpu;
using testing::on_gpu;
using testing::random_cpu;
using testing::rel_error;

class CudaClassifierLossTest : public testing::CudaTest {};

Tensor labels_for(int64_t rows, int64_t vocab, DType dtype) {
  std::vector<int64_t> l(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) l[r] = r % 5 == 3 ? -100 : (r * 7919 + 13) % vocab;
  return raw::to(from_vector(l, {rows}), dtype);
}

TEST_F(CudaClassifierLossTest, MatchesTheCpuForEveryKernelVariant) {
  // vocab 200: 16-byte vectors, row in shared memory (700 and 400 rows: more rows than blocks, so blocks
  // walk several rows, ignored rows among them); 203: scalars, shared memory; 60000: a bf16 row of 117 KiB
  // in shared memory; 130000 (f32 and bf16 rows past the shared memory of a block): vectors re-read
  // from global memory; 130001: scalars, re-read.
  struct Case {
    int64_t rows, width, vocab, chunk;
  };
  for (const Case& c : {Case{37, 24, 200, 8}, Case{700, 8, 200, 0}, Case{400, 8, 6144, 300}, Case{33, 16, 203, 0},
                        Case{6, 8, 60000, 4}, Case{5, 8, 130000, 2}, Case{4, 8, 130001, 3}}) {
    for (DType dtype : {DType::f32, DType::bf16, DType::f64}) {
      for (DType ldtype : {DType::i64, DType::i32}) {
        const std::string what = dtype_name(dtype) + " vocab " + std::to_string(c.vocab) + " chunk " +
                                 std::to_string(c.chunk) + " labels " + dtype_name(ldtype);
        const Tensor h = random_cpu({c.rows, c.width}, dtype, 1, -2, 2);
        const Tensor w = random_cpu({c.vocab, c.width}, dtype, 2, -2, 2);
        const Tensor l = labels_for(c.rows, c.vocab, ldtype);
        const ClassifierLossOptions o{.normalizer = 0, .chunk_rows = c.chunk};
        const auto ref = raw::classifier_loss(h, w, l, o);
        const auto got = raw::classifier_loss(on_gpu(h), on_gpu(w), on_gpu(l), o);
        EXPECT_EQ(got.divisor, ref.divisor) << what;
        EXPECT_EQ(got.dweight.dtype(), ref.dweight.dtype()) << what;
        const double tol = dtype == DType::f64 ? 1e-12 : (dtype == DType::f32 ? 1e-5 : 1e-2);
        EXPECT_NEAR(on_cpu(got.loss).item<double>(), ref.loss.item<double>(), tol * std::abs(ref.loss.item<double>()))
            << what;
        EXPECT_LT(rel_error(on_cpu(got.dhidden), ref.dhidden), tol) << what;
        EXPECT_LT(rel_error(on_cpu(got.dweight), ref.dweight), tol) << what;
      }
    }
  }
}

// The divisor read from device memory (ClassifierLossOptions::normalizer_tensor, what a captured CUDA graph
// refills) gives the value's bits on the GPU, for every dtype; a different tensor value is what divides.
TEST_F(CudaClassifierLossTest, ANormalizerTensorGivesTheSameBitsAsTheValue) {
  for (DType dtype : {DType::f32, DType::bf16, DType::f64}) {
    const Tensor h = on_gpu(random_cpu({300, 16}, dtype, 5, -2, 2));
    const Tensor w = on_gpu(random_cpu({1000, 16}, dtype, 6, -2, 2));
    const Tensor l = on_gpu(labels_for(300, 1000, DType::i64));
    const auto by_value = raw::classifier_loss(h, w, l, {.normalizer = 977, .chunk_rows = 128});
    const Tensor d = on_gpu(scalar_tensor(977.0, {.dtype = DType::f64}));
    const auto by_tensor =
        raw::classifier_loss(h, w, l, {.normalizer = 977, .normalizer_tensor = d, .chunk_rows = 128});
    EXPECT_EQ(on_cpu(by_tensor.loss).to_vector<double>(), on_cpu(by_value.loss).to_vector<double>()) << dtype;
    EXPECT_EQ(on_cpu(by_tensor.dhidden).to_vector<double>(), on_cpu(by_value.dhidden).to_vector<double>()) << dtype;
    EXPECT_EQ(on_cpu(by_tensor.dweight).to_vector<double>(), on_cpu(by_value.dweight).to_vector<double>()) << dtype;
    const auto other = raw::classifier_loss(h, w, l, {.normalizer = 977, .chunk_rows = 128});
    raw::fill_(d, 488.5);
    const auto halved = raw::classifier_loss(h, w, l, {.normalizer = 977, .normalizer_tensor = d, .chunk_rows = 128});
    EXPECT_NEAR(on_cpu(halved.loss).item<double>(), 2 * on_cpu(other.loss).item<double>(),
                1e-2 * std::abs(on_cpu(other.loss).item<double>()))
        << dtype;
  }
}

TEST_F(CudaClassifierLossTest, LossOnlyAndAllIgnored) {
  const Tensor h = random_cpu({20, 16}, DType::bf16, 3);
  const Tensor w = random_cpu({64, 16}, DType::bf16, 4);
  const Tensor l = labels_for(20, 64, DType::i64);
  const auto ref = raw::classifier_loss(h, w, l, {.chunk_rows = 7, .compute_grads = false});
  const auto got = raw::classifier_loss(on_gpu(h), on_gpu(w), on_gpu(l), {.chunk_rows = 7, .compute_grads = false});
  EXPECT_FALSE(got.dhidden.defined());
  EXPECT_NEAR(on_cpu(got.loss).item<double>(), ref.loss.item<double>(), 1e-2 * ref.loss.item<double>());
  const Tensor ignored = full({20}, -100, {.dtype = DType::i64});
  const auto none = raw::classifier_loss(on_gpu(h), on_gpu(w), on_gpu(ignored), {.chunk_rows = 7});
  EXPECT_EQ(on_cpu(none.loss).item<double>(), 0.0);
  EXPECT_TRUE(all_close(on_cpu(none.dweight), zeros({64, 16}), 0, 0));
  EXPECT_TRUE(all_close(on_cpu(none.dhidden), zeros({20, 16}), 0, 0));
}

TEST_F(CudaClassifierLossTest, LabelOutOfRangeIsReportedAtTheNextSynchronisation) {
  const Tensor h = on_gpu(random_cpu({4, 8}, DType::f32, 5));
  const Tensor w = on_gpu(random_cpu({10, 8}, DType::f32, 6));
  const Tensor l = on_gpu(from_vector<int64_t>({1, 2, 10, 3}, {4}));
  EXPECT_CPF_ERROR(
      {
        const auto r = raw::classifier_loss(h, w, l, {.normalizer = 4});
        (void)r.loss.item<double>();
      },
      "classifier_loss: target 10 at row 2 is out of range for C=10 classes");
}

// Peak allocated bytes of fn beyond what was allocated before it.
template <class Fn>
size_t peak_of(Fn&& fn) {
  const size_t before = cuda::memory_stats(0).allocated;
  cuda::reset_peak_memory_stats(0);
  fn();
  return cuda::memory_stats(0).peak_allocated - before;
}

TEST_F(CudaClassifierLossTest, PeakMemoryIsBelowTheUnfusedPathByTheLogits) {
  // (4096, 256) x 50304 bf16: the logits are 412 MB; the fused path's chunks 512 rows (51 MB).
  const int64_t rows = 4096, width = 256, vocab = 50304;
  const Tensor l = on_gpu(labels_for(rows, vocab, DType::i64));
  auto leaf = [](const Tensor& t) {
    Tensor x = on_gpu(t);
    x.set_requires_grad(true);
    return x;
  };
  const Tensor h_cpu = random_cpu({rows, width}, DType::bf16, 7), w_cpu = random_cpu({vocab, width}, DType::bf16, 8);
  Tensor h1 = leaf(h_cpu), w1 = leaf(w_cpu), h2 = leaf(h_cpu), w2 = leaf(w_cpu);
  double unfused_loss = 0, fused_loss = 0;
  const size_t unfused = peak_of([&] {
    const Tensor loss = cross_entropy(matmul(h1, transpose(w1, 0, 1)), l);
    backward(loss);
    unfused_loss = loss.item<double>();
  });
  const size_t fused = peak_of([&] {
    const Tensor loss = classifier_loss(h2, w2, l, {.chunk_rows = 512});
    backward(loss);
    fused_loss = loss.item<double>();
  });
  const size_t logits_bytes = static_cast<size_t>(rows * vocab) * 2;
  EXPECT_LE(fused + logits_bytes, unfused) << "fused peak " << fused << " B, unfused " << unfused << " B";
  EXPECT_NEAR(fused_loss, unfused_loss, 1e-2 * unfused_loss);
  EXPECT_LT(rel_error(on_cpu(h2.grad()), on_cpu(h1.grad())), 2e-2);
  EXPECT_LT(rel_error(on_cpu(w2.grad()), on_cpu(w1.grad())), 2e-2);
}

}  // namespace
}  // namespace cpf
