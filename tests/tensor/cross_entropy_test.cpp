#include "framework/tensor/ops/cross_entropy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#if defined(CPF_WITH_OPENMP)
#include <omp.h>
#endif

#include "framework/tensor/ops/views.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

using testing::all_close;
using testing::random_tensor;

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Reference {
  double loss = 0;
  Tensor lse;
  int64_t count = 0;
  Tensor dlogits;
};

// Plain loops in double: lse per row, loss = mean(lse - x[target]) over valid rows,
// dlogits = (softmax - onehot) * grad / count.
Reference reference_cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore, double grad = 1.0) {
  const int64_t rows = logits.size(0), classes = logits.size(1);
  const auto x = logits.to_vector<double>();
  const auto t = targets.to_vector<int64_t>();
  Reference ref;
  std::vector<double> lse(rows), d(x.size(), 0.0);
  double total = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double m = -kInf;
    for (int64_t c = 0; c < classes; ++c) m = std::max(m, x[r * classes + c]);
    double s = 0;
    for (int64_t c = 0; c < classes; ++c) s += std::exp(x[r * classes + c] - m);
    lse[r] = m == -kInf ? -kInf : m + std::log(s);
    if (t[r] == ignore) continue;
    ++ref.count;
    total += lse[r] - x[r * classes + t[r]];
  }
  ref.loss = ref.count ? total / static_cast<double>(ref.count) : 0.0;
  for (int64_t r = 0; r < rows && ref.count; ++r) {
    if (t[r] == ignore) continue;
    for (int64_t c = 0; c < classes; ++c) {
      d[r * classes + c] = (std::exp(x[r * classes + c] - lse[r]) - (c == t[r] ? 1.0 : 0.0)) * grad / ref.count;
    }
  }
  ref.lse = from_vector(lse, {rows});
  ref.dlogits = from_vector(d, {rows, classes});
  return ref;
}

void expect_matches(const Tensor& logits, const Tensor& targets, int64_t ignore, double grad, double tol,
                    double grad_tol = 0) {
  const auto r = raw::cross_entropy(logits, targets, ignore);
  const Reference ref = reference_cross_entropy(logits, targets, ignore, grad);
  const DType compute = logits.dtype() == DType::f64 ? DType::f64 : DType::f32;
  EXPECT_EQ(r.loss.shape(), Shape{});
  EXPECT_EQ(r.loss.dtype(), compute);
  EXPECT_EQ(r.lse.dtype(), compute);
  EXPECT_EQ(r.valid_count, ref.count);
  EXPECT_NEAR(r.loss.item<double>(), ref.loss, tol * (1 + std::abs(ref.loss)));
  EXPECT_TRUE(all_close(r.lse, ref.lse, tol, tol));
  const Tensor d =
      raw::cross_entropy_backward(full({}, grad, {.dtype = compute}), logits, targets, r.lse, r.valid_count, ignore);
  EXPECT_EQ(d.dtype(), logits.dtype());
  EXPECT_TRUE(all_close(d, ref.dlogits, grad_tol > 0 ? grad_tol : tol, grad_tol > 0 ? grad_tol : tol));
}

TEST(CrossEntropy, MatchesReference) {
  for (DType dtype : {DType::f32, DType::f64}) {
    const double tol = dtype == DType::f32 ? 1e-5 : 1e-12;
    const Tensor logits = random_tensor({6, 5}, dtype, 1, -4, 4);
    expect_matches(logits, from_vector<int64_t>({0, 4, -100, 2, 2, 1}, {6}), -100, 1.0, tol);
    expect_matches(logits, from_vector<int32_t>({3, 4, 3, 0, 1, 3}, {6}), 3, 2.5, tol);  // an in-range ignore_index
    expect_matches(logits, from_vector<int32_t>({3, 4, 3, 0, 1, 3}, {6}), -1, 1.0, tol);
    // Threaded sizes.
    const Tensor big = random_tensor({512, 1000}, dtype, 2, -6, 6);
    expect_matches(big, randint(0, 1000, {512}), -100, 0.5, tol);
  }
}

TEST(CrossEntropy, AllIgnoredGivesZeroNotNan) {
  const Tensor logits = random_tensor({3, 4}, DType::f32, 3);
  const Tensor targets = full({3}, -100, {.dtype = DType::i64});
  const auto r = raw::cross_entropy(logits, targets);
  EXPECT_EQ(r.valid_count, 0);
  EXPECT_EQ(r.loss.item<double>(), 0.0);
  const Tensor d = raw::cross_entropy_backward(scalar_tensor(1.0, {.dtype = DType::f32}), logits, targets, r.lse, 0);
  for (double v : d.to_vector<double>()) EXPECT_EQ(v, 0.0);
  // Empty batch.
  const auto e = raw::cross_entropy(zeros({0, 4}), zeros({0}, {.dtype = DType::i64}));
  EXPECT_EQ(e.loss.item<double>(), 0.0);
  EXPECT_EQ(e.lse.shape(), (Shape{0}));
}

TEST(CrossEntropy, NonContiguousAndBf16Logits) {
  const Tensor logits = raw::transpose(random_tensor({7, 4}, DType::f64, 4, -3, 3), 0, 1);  // (4, 7)
  ASSERT_FALSE(logits.is_contiguous());
  const Tensor targets = raw::select(from_vector<int64_t>({1, 0, 6, 0, 2, 0, -100, 0}, {4, 2}), 1, 0);  // stride 2
  ASSERT_FALSE(targets.is_contiguous());
  expect_matches(logits, targets, -100, 1.0, 1e-12);
  const Tensor lb = raw::to(random_tensor({5, 33}, DType::f32, 5, -3, 3), DType::bf16);
  expect_matches(lb, from_vector<int64_t>({0, 32, 5, -100, 7}, {5}), -100, 1.0, 1e-5, 1e-2);  // bf16 gradient
}

TEST(CrossEntropy, ExtremeLogits) {
  // Large values do not overflow; -inf logits (masked classes) get exactly zero gradient.
  const Tensor logits = from_vector<float>({1000, 1001, 999, -INFINITY, 5, -INFINITY}, {2, 3});
  const Tensor targets = from_vector<int64_t>({1, 1}, {2});
  const auto r = raw::cross_entropy(logits, targets);
  const double expected = (std::log(1 + std::exp(-1.0) + std::exp(-2.0)) + 0.0) / 2;
  EXPECT_NEAR(r.loss.item<double>(), expected, 1e-5);
  const auto d = raw::cross_entropy_backward(scalar_tensor(1.0, {.dtype = DType::f32}), logits, targets, r.lse, 2)
                     .to_vector<double>();
  EXPECT_EQ(d[3], 0.0);
  EXPECT_EQ(d[5], 0.0);
  EXPECT_EQ(d[4], 0.0);  // p = 1 at the target: 1 - 1
}

TEST(CrossEntropy, LossDoesNotDependOnThreadCount) {
#if defined(CPF_WITH_OPENMP)
  const Tensor logits = random_tensor({1024, 300}, DType::f32, 6, -5, 5);
  const Tensor targets = randint(0, 300, {1024});
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const float one = raw::cross_entropy(logits, targets).loss.item<float>();
  omp_set_num_threads(std::max(saved, 3));
  const float many = raw::cross_entropy(logits, targets).loss.item<float>();
  omp_set_num_threads(saved);
  EXPECT_EQ(one, many);
#else
  GTEST_SKIP() << "built without OpenMP";
#endif
}

TEST(CrossEntropy, RejectsBadInputs) {
  const Tensor logits = random_tensor({3, 4}, DType::f32);
  const Tensor targets = from_vector<int64_t>({0, 1, 2}, {3});
  EXPECT_CPF_ERROR(raw::cross_entropy(Tensor(), targets), "cross_entropy: argument 'logits' is an undefined tensor");
  EXPECT_CPF_ERROR(raw::cross_entropy(logits, Tensor()), "cross_entropy: argument 'targets' is an undefined tensor");
  EXPECT_CPF_ERROR(raw::cross_entropy(random_tensor({2, 3, 4}, DType::f32), targets),
                   "cross_entropy: logits must be 2-D (N, C), got shape [2,3,4] (flatten the leading dims first)");
  EXPECT_CPF_ERROR(raw::cross_entropy(zeros({3, 4}, {.dtype = DType::i64}), targets),
                   "cross_entropy: logits must be a floating tensor, got i64");
  EXPECT_CPF_ERROR(raw::cross_entropy(zeros({3, 0}), targets),
                   "cross_entropy: logits need at least one class, got shape [3,0]");
  EXPECT_CPF_ERROR(raw::cross_entropy(logits, random_tensor({3}, DType::f32)),
                   "cross_entropy: targets must be i32 or i64, got f32");
  EXPECT_CPF_ERROR(raw::cross_entropy(logits, from_vector<int64_t>({0, 1}, {2})),
                   "cross_entropy: targets must have shape [3] to match logits [3,4], got [2]");
  EXPECT_CPF_ERROR(raw::cross_entropy(logits, from_vector<int64_t>({0, 4, 1}, {3})),
                   "cross_entropy: target 4 at row 1 is out of range for C=4 classes (expected 0..3 or "
                   "ignore_index=-100)");
  EXPECT_CPF_ERROR(raw::cross_entropy(logits, from_vector<int32_t>({0, 1, -1}, {3})),
                   "cross_entropy: target -1 at row 2 is out of range for C=4 classes");
  EXPECT_CPF_ERROR(raw::cross_entropy(logits, from_vector<int32_t>({0, 1, -100}, {3}), 7),
                   "cross_entropy: target -100 at row 2 is out of range for C=4 classes (expected 0..3 or "
                   "ignore_index=7)");

  const auto r = raw::cross_entropy(logits, targets);
  const Tensor g = scalar_tensor(1.0, {.dtype = DType::f32});
  EXPECT_CPF_ERROR(raw::cross_entropy_backward(Tensor(), logits, targets, r.lse, 3),
                   "cross_entropy_backward: argument 'grad_loss' is an undefined tensor");
  EXPECT_CPF_ERROR(raw::cross_entropy_backward(random_tensor({2}, DType::f32), logits, targets, r.lse, 3),
                   "cross_entropy_backward: grad_loss must be a one-element floating tensor, got f32 [2]");
  EXPECT_CPF_ERROR(raw::cross_entropy_backward(g, logits, targets, random_tensor({4}, DType::f32), 3),
                   "cross_entropy_backward: lse must be f32 [3] (from the forward), got f32 [4]");
  EXPECT_CPF_ERROR(raw::cross_entropy_backward(g, logits, targets, raw::to(r.lse, DType::f64), 3),
                   "cross_entropy_backward: lse must be f32 [3] (from the forward), got f64 [3]");
  EXPECT_CPF_ERROR(raw::cross_entropy_backward(g, logits, targets, r.lse, 2),
                   "cross_entropy_backward: valid_count 2 does not match the 3 targets that are not "
                   "ignore_index=-100");
  EXPECT_CPF_ERROR(raw::cross_entropy_backward(g, logits, from_vector<int64_t>({0, 9, 1}, {3}), r.lse, 3),
                   "cross_entropy_backward: target 9 at row 1 is out of range for C=4 classes");
}

}  // namespace
}  // namespace cpf
