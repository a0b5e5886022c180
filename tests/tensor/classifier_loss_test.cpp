// The fused classifier (raw::classifier_loss) on the CPU: equal to the unfused path (matmul, cross-entropy,
// its backward and the two gradient GEMMs) to 1e-12 in f64 for every chunking, the chunk-size rule, and
// the refused inputs with their messages.
#include <gtest/gtest.h>

#include "framework/tensor/ops/classifier_loss.h"
#include "framework/tensor/ops/classifier_row_kernel.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/cross_entropy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/matmul.h"
#include "framework/tensor/ops/views.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

using testing::all_close;
using testing::random_tensor;

struct Unfused {
  Tensor loss, dhidden, dweight;
};

// The unfused path the fused op replaces: the whole (T, V) logits, mean cross-entropy rescaled to
// sum / normalizer (as GPT::loss does), its gradient for an incoming loss gradient of 1.
Unfused unfused(const Tensor& hidden, const Tensor& weight, const Tensor& labels, int64_t normalizer,
                int64_t ignore_index = -100) {
  const Tensor logits = raw::matmul(hidden, raw::transpose(weight, 0, 1));  // (T, V)
  const raw::CrossEntropyResult ce = raw::cross_entropy(logits, labels, ignore_index);
  const int64_t divisor = normalizer > 0 ? normalizer : std::max<int64_t>(ce.valid_count, 1);
  const double factor = static_cast<double>(ce.valid_count) / static_cast<double>(divisor);
  Unfused u;
  u.loss = scalar_tensor(ce.loss.item<double>() * factor, {.dtype = ce.loss.dtype()});
  const Tensor g = scalar_tensor(factor, {.dtype = DType::f64});
  const Tensor dlogits = raw::cross_entropy_backward(g, logits, labels, ce.lse, ce.valid_count, ignore_index);
  u.dhidden = raw::matmul(dlogits, weight);                        // (T, C)
  u.dweight = raw::matmul(raw::transpose(dlogits, 0, 1), hidden);  // (V, C)
  return u;
}

Tensor labels_for(int64_t rows, int64_t vocab, bool some_ignored) {
  std::vector<int64_t> l(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) l[r] = some_ignored && r % 4 == 1 ? -100 : (r * 7 + 3) % vocab;
  return from_vector(l, {rows});
}

TEST(ClassifierLossTest, EqualsTheUnfusedPathForEveryChunking) {
  const int64_t rows = 37, width = 5, vocab = 11;
  const Tensor hidden = random_tensor({rows, width}, DType::f64, 1, -2, 2);
  const Tensor weight = random_tensor({vocab, width}, DType::f64, 2, -2, 2);
  for (bool ignored : {false, true}) {
    const Tensor labels = labels_for(rows, vocab, ignored);
    for (int64_t normalizer : {int64_t(0), int64_t(50)}) {
      const Unfused ref = unfused(hidden, weight, labels, normalizer);
      for (int64_t chunk : {0, 1, 8, 36, 37, 100}) {
        const std::string what = "chunk " + std::to_string(chunk) + " normalizer " + std::to_string(normalizer) +
                                 (ignored ? " with ignored rows" : "");
        const raw::ClassifierLossResult got =
            raw::classifier_loss(hidden, weight, labels, {.normalizer = normalizer, .chunk_rows = chunk});
        EXPECT_EQ(got.chunk_rows, chunk == 0 || chunk > rows ? rows : chunk) << what;
        EXPECT_EQ(got.loss.dtype(), DType::f64);
        EXPECT_TRUE(all_close(got.loss, ref.loss, 1e-12, 1e-12)) << what;
        EXPECT_TRUE(all_close(got.dhidden, ref.dhidden, 1e-12, 1e-12)) << what;
        EXPECT_TRUE(all_close(got.dweight, ref.dweight, 1e-12, 1e-12)) << what;
      }
    }
  }
}

TEST(ClassifierLossTest, I32LabelsAndAnotherIgnoreIndex) {
  const Tensor hidden = random_tensor({9, 3}, DType::f64, 3);
  const Tensor weight = random_tensor({6, 3}, DType::f64, 4);
  const Tensor labels = from_vector<int32_t>({0, 5, 2, 2, 1, 2, 4, 3, 2}, {9});
  const Unfused ref = unfused(hidden, weight, labels, 0, 2);
  const auto got = raw::classifier_loss(hidden, weight, labels, {.ignore_index = 2, .chunk_rows = 4});
  EXPECT_EQ(got.divisor, 5);
  EXPECT_TRUE(all_close(got.loss, ref.loss, 1e-12, 1e-12));
  EXPECT_TRUE(all_close(got.dhidden, ref.dhidden, 1e-12, 1e-12));
  EXPECT_TRUE(all_close(got.dweight, ref.dweight, 1e-12, 1e-12));
}

TEST(ClassifierLossTest, EveryLabelIgnoredGivesZeroLossAndGradients) {
  const Tensor hidden = random_tensor({4, 3}, DType::f64, 5);
  const Tensor weight = random_tensor({5, 3}, DType::f64, 6);
  const Tensor labels = from_vector<int64_t>({-100, -100, -100, -100}, {4});
  const auto got = raw::classifier_loss(hidden, weight, labels, {.chunk_rows = 3});
  EXPECT_EQ(got.loss.item<double>(), 0.0);
  EXPECT_TRUE(all_close(got.dhidden, zeros({4, 3}, {.dtype = DType::f64}), 0, 0));
  EXPECT_TRUE(all_close(got.dweight, zeros({5, 3}, {.dtype = DType::f64}), 0, 0));
}

TEST(ClassifierLossTest, LossOnlyLeavesTheGradientsUndefined) {
  const Tensor hidden = random_tensor({6, 3}, DType::f64, 7);
  const Tensor weight = random_tensor({5, 3}, DType::f64, 8);
  const Tensor labels = labels_for(6, 5, true);
  const auto got = raw::classifier_loss(hidden, weight, labels, {.chunk_rows = 4, .compute_grads = false});
  EXPECT_FALSE(got.dhidden.defined());
  EXPECT_FALSE(got.dweight.defined());
  EXPECT_TRUE(all_close(got.loss, unfused(hidden, weight, labels, 0).loss, 1e-12, 1e-12));
}

TEST(ClassifierLossTest, Bf16ComputesInF32AndMatchesTheUnfusedPath) {
  // bf16 inputs: logits rounded to bf16 per chunk as the unfused GEMM rounds them, f32 math; the
  // gradients come back f32 (dweight summed over chunks in f32).
  const Tensor hidden = raw::to(random_tensor({40, 8}, DType::f64, 9, -2, 2), DType::bf16);
  const Tensor weight = raw::to(random_tensor({30, 8}, DType::f64, 10, -2, 2), DType::bf16);
  const Tensor labels = labels_for(40, 30, true);
  const Unfused ref = unfused(hidden, weight, labels, 0);
  const auto got = raw::classifier_loss(hidden, weight, labels, {.chunk_rows = 16});
  EXPECT_EQ(got.loss.dtype(), DType::f32);
  EXPECT_EQ(got.dhidden.dtype(), DType::f32);
  EXPECT_EQ(got.dweight.dtype(), DType::f32);
  EXPECT_TRUE(all_close(got.loss, ref.loss, 1e-5, 1e-5));
  EXPECT_TRUE(all_close(got.dhidden, raw::to(ref.dhidden, DType::f32), 1e-3, 1.0 / 64));
  EXPECT_TRUE(all_close(got.dweight, raw::to(ref.dweight, DType::f32), 1e-3, 1.0 / 64));
}

TEST(ClassifierLossTest, ChunkRowsByMemory) {
  // GPT-2's head in bf16: 1 GiB / (50304 x 2 bytes) = 10672 rows, rounded down to 10624 (a multiple of 128),
  // so 32768 rows need 4 chunks, made equal: 8192 rows each (not 3 x 10624 + 896).
  EXPECT_EQ(raw::classifier_chunk_rows(0, 32768, 50304, DType::bf16), 8192);
  // f32: a budget of 5248 rows, 7 chunks of 4682 rows rounded up to 4736 (the last one 4352).
  EXPECT_EQ(raw::classifier_chunk_rows(0, 32768, 50304, DType::f32), 4736);
  EXPECT_EQ(raw::classifier_chunk_rows(0, 10624, 50304, DType::bf16), 10624);  // exactly one budget
  EXPECT_EQ(raw::classifier_chunk_rows(0, 10625, 50304, DType::bf16), 5376);   // just over: two halves
  EXPECT_EQ(raw::classifier_chunk_rows(0, 100, 50304, DType::bf16), 100);      // fewer rows than a chunk
  // A vocabulary so wide that 128 rows pass the budget: 128 rows still.
  EXPECT_EQ(raw::classifier_chunk_rows(0, 1000, int64_t(1) << 22, DType::f32), 128);
  EXPECT_EQ(raw::classifier_chunk_rows(300, 1000, 50, DType::f32), 300);
  EXPECT_EQ(raw::classifier_chunk_rows(0, 0, 50, DType::f32), 1);
  EXPECT_CPF_ERROR(raw::classifier_chunk_rows(-1, 10, 5, DType::f32), "requested=-1");
}

// The divisor as a device scalar (what a CUDA graph refills): the same loss and gradients, bit for bit,
// as the value; the tensor, not the value, is what the row pass and the division read.
TEST(ClassifierLossTest, ANormalizerTensorGivesTheSameBitsAsTheValue) {
  const int64_t rows = 29, width = 6, vocab = 13;
  const Tensor hidden = random_tensor({rows, width}, DType::f64, 3, -2, 2);
  const Tensor weight = random_tensor({vocab, width}, DType::f64, 4, -2, 2);
  const Tensor labels = labels_for(rows, vocab, true);
  for (DType dtype : {DType::f64, DType::f32, DType::bf16}) {
    const Tensor h = raw::to(hidden, dtype), w = raw::to(weight, dtype);
    const auto by_value = raw::classifier_loss(h, w, labels, {.normalizer = 37, .chunk_rows = 8});
    const auto by_tensor = raw::classifier_loss(
        h, w, labels,
        {.normalizer = 37, .normalizer_tensor = scalar_tensor(37.0, {.dtype = DType::f64}), .chunk_rows = 8});
    EXPECT_EQ(by_tensor.loss.to_vector<double>(), by_value.loss.to_vector<double>()) << dtype;
    EXPECT_EQ(by_tensor.dhidden.to_vector<double>(), by_value.dhidden.to_vector<double>()) << dtype;
    EXPECT_EQ(by_tensor.dweight.to_vector<double>(), by_value.dweight.to_vector<double>()) << dtype;
  }
  // The tensor's value is what divides: 74 halves the loss the host value 37 would give.
  const auto halved = raw::classifier_loss(
      hidden, weight, labels, {.normalizer = 37, .normalizer_tensor = scalar_tensor(74.0, {.dtype = DType::f64})});
  const auto full = raw::classifier_loss(hidden, weight, labels, {.normalizer = 37});
  EXPECT_NEAR(halved.loss.item<double>(), full.loss.item<double>() / 2, 1e-12);
  EXPECT_TRUE(all_close(raw::mul(halved.dhidden, 2.0), full.dhidden, 1e-12, 1e-12));
}

TEST(ClassifierLossTest, RefusedInputsNameTheProblem) {
  const Tensor h = random_tensor({4, 3}, DType::f64, 11);
  const Tensor w = random_tensor({5, 3}, DType::f64, 12);
  const Tensor l = from_vector<int64_t>({0, 1, 2, 3}, {4});
  EXPECT_CPF_ERROR(raw::classifier_loss(h, w, from_vector<int64_t>({0, 7, 2, 3}, {4})),
                   "classifier_loss: target 7 at row 1 is out of range for C=5 classes");
  EXPECT_CPF_ERROR(raw::classifier_loss(h, w, from_vector<int64_t>({0, 1, -1, 3}, {4})), "target -1 at row 2");
  EXPECT_CPF_ERROR(raw::classifier_loss(raw::reshape(h, {2, 2, 3}), w, l),
                   "hidden must be 2-D (T, C), got shape [2,2,3]");
  EXPECT_CPF_ERROR(raw::classifier_loss(h, random_tensor({5, 4}, DType::f64, 13), l),
                   "weight must be (V, C) with V >= 1 and C = hidden's 3, got [5,4]");
  EXPECT_CPF_ERROR(raw::classifier_loss(h, raw::to(w, DType::f32), l),
                   "classifier_loss: dtypes differ: f64 [4,3] vs f32 [5,3]");
  EXPECT_CPF_ERROR(raw::classifier_loss(raw::to(h, DType::i64), raw::to(w, DType::i64), l),
                   "hidden must be a floating tensor, got i64");
  EXPECT_CPF_ERROR(raw::classifier_loss(h, w, raw::to(l, DType::f32)), "labels must be i32 or i64, got f32");
  EXPECT_CPF_ERROR(raw::classifier_loss(h, w, from_vector<int64_t>({0, 1, 2}, {3})),
                   "labels must have shape [4] to match hidden [4,3], got [3]");
  EXPECT_CPF_ERROR(raw::classifier_loss(h, w, l, {.normalizer = -2}), "normalizer=-2 must be >= 1");
  EXPECT_CPF_ERROR(raw::classifier_loss(h, w, l, {.chunk_rows = -5}), "chunk_rows=-5 must be >= 1");
  EXPECT_CPF_ERROR(raw::classifier_loss(Tensor(), w, l), "classifier_loss: argument 'hidden' is an undefined tensor");
  EXPECT_CPF_ERROR(raw::classifier_loss(h, w, l, {.normalizer = 4, .normalizer_tensor = scalar_tensor(4.0)}),
                   "normalizer_tensor must be a () f64 tensor on cpu, got [] f32 on cpu");
  EXPECT_CPF_ERROR(
      raw::classifier_loss(h, w, l, {.normalizer = 4, .normalizer_tensor = full({1}, 4.0, {.dtype = DType::f64})}),
      "normalizer_tensor must be a () f64 tensor on cpu, got [1] f64 on cpu");
  EXPECT_CPF_ERROR(raw::classifier_loss(h, w, l, {.normalizer_tensor = scalar_tensor(4.0, {.dtype = DType::f64})}),
                   "normalizer_tensor needs normalizer >= 1 (the same count), got 0");
}

TEST(ClassifierRowKernelTest, ParsesTheNamesAndRefusesOthers) {
  EXPECT_EQ(raw::parse_classifier_row_kernel("auto"), raw::ClassifierRowKernel::automatic);
  EXPECT_EQ(raw::parse_classifier_row_kernel("cached"), raw::ClassifierRowKernel::cached);
  EXPECT_EQ(raw::parse_classifier_row_kernel("reread256"), raw::ClassifierRowKernel::reread256);
  EXPECT_EQ(raw::parse_classifier_row_kernel("reread512"), raw::ClassifierRowKernel::reread512);
  EXPECT_EQ(raw::parse_classifier_row_kernel("reread1024"), raw::ClassifierRowKernel::reread1024);
  EXPECT_CPF_ERROR(raw::parse_classifier_row_kernel("fast"),
                   "CPF_CLASSIFIER_ROW_KERNEL=fast is not a classifier row kernel; use auto, cached, reread256");
  EXPECT_CPF_ERROR(raw::parse_classifier_row_kernel(""), "CPF_CLASSIFIER_ROW_KERNEL= is not");
}

}  // namespace
}  // namespace cpf
