// Reductions (framework/tensor/ops/reduce.h) against naive loops: every op over every dim set, with
// and without keepdim, non-contiguous and large inputs, bf16, empty dims, special values, errors.
#include "framework/tensor/ops/reduce.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/views.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

using testing::all_close;
using testing::random_tensor;

// Naive reduction: folds every element into the output slot named by its kept coordinates.
// `init` starts each slot, `step(acc, v)` folds, `finish(acc, count)` closes.
struct NaiveReduction {
  std::vector<double> values;
  Shape shape;
};

NaiveReduction naive_reduce(const Tensor& x, std::vector<int64_t> dims, bool keepdim, double init,
                            const std::function<double(double, double)>& step,
                            const std::function<double(double, int64_t)>& finish) {
  const int64_t nd = x.dim();
  if (dims.empty()) {
    for (int64_t d = 0; d < nd; ++d) dims.push_back(d);
  }
  std::vector<bool> reduced(static_cast<size_t>(nd), false);
  for (int64_t d : dims) reduced[static_cast<size_t>(d < 0 ? d + nd : d)] = true;
  Shape out_shape, kept_shape;
  for (int64_t d = 0; d < nd; ++d) {
    if (!reduced[d]) kept_shape.push_back(x.size(d));
    if (!reduced[d] || keepdim) out_shape.push_back(reduced[d] ? 1 : x.size(d));
  }
  const int64_t out_n = shape_numel(kept_shape);
  std::vector<double> acc(static_cast<size_t>(out_n), init);
  std::vector<int64_t> counts(static_cast<size_t>(out_n), 0);
  const auto xv = x.to_vector<double>();
  for (int64_t flat = 0; flat < static_cast<int64_t>(xv.size()); ++flat) {
    int64_t rest = flat, out_index = 0, scale = 1;
    for (int64_t d = nd - 1; d >= 0; --d) {
      const int64_t coord = rest % x.size(d);
      rest /= x.size(d);
      if (!reduced[d]) {
        out_index += coord * scale;
        scale *= x.size(d);
      }
    }
    acc[out_index] = step(acc[out_index], xv[flat]);
    counts[out_index] += 1;
  }
  for (int64_t i = 0; i < out_n; ++i) acc[i] = finish(acc[i], counts[i]);
  return {acc, out_shape};
}

NaiveReduction naive_sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return naive_reduce(x, dims, keepdim, 0.0, std::plus<double>(), [](double a, int64_t) { return a; });
}
NaiveReduction naive_mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return naive_reduce(x, dims, keepdim, 0.0, std::plus<double>(),
                      [](double a, int64_t n) { return n == 0 ? NAN : a / static_cast<double>(n); });
}
NaiveReduction naive_amax(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return naive_reduce(
      x, dims, keepdim, -INFINITY,
      [](double a, double v) { return std::isnan(a) || std::isnan(v) ? NAN : std::max(a, v); },
      [](double a, int64_t) { return a; });
}
NaiveReduction naive_logsumexp(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  // Plain sum of exp (inputs stay small in these tests), then log.
  return naive_reduce(
      x, dims, keepdim, 0.0, [](double a, double v) { return a + std::exp(v); },
      [](double a, int64_t) { return std::log(a); });
}

using RawReduce = Tensor (*)(const Tensor&, const std::vector<int64_t>&, bool);
using NaiveReduce = NaiveReduction (*)(const Tensor&, const std::vector<int64_t>&, bool);
const std::pair<const char*, std::pair<RawReduce, NaiveReduce>> kReductions[] = {
    {"sum", {&raw::sum, &naive_sum}},
    {"mean", {&raw::mean, &naive_mean}},
    {"amax", {&raw::amax, &naive_amax}},
    {"logsumexp", {&raw::logsumexp, &naive_logsumexp}},
};

const std::vector<std::vector<int64_t>> kDimSets = {{},     {0},    {1},    {2},       {-1},
                                                    {0, 2}, {2, 0}, {1, 2}, {0, 1, 2}, {-3, -2}};

void check_all_reductions(const Tensor& x, double atol, double rtol) {
  for (const auto& [name, fns] : kReductions) {
    for (const auto& dims : kDimSets) {
      for (bool keepdim : {false, true}) {
        SCOPED_TRACE(std::string(name) + " dims " + shape_str(dims) + (keepdim ? " keepdim" : "") + " on " +
                     dtype_name(x.dtype()) + " " + shape_str(x.shape()) + " strides " + shape_str(x.strides()));
        Tensor y = fns.first(x, dims, keepdim);
        const NaiveReduction ref = fns.second(x, dims, keepdim);
        EXPECT_EQ(y.dtype(), x.dtype());
        ASSERT_EQ(y.shape(), ref.shape);
        EXPECT_TRUE(all_close(y, from_vector<double>(ref.values, ref.shape), atol, rtol));
      }
    }
  }
}

TEST(Reduce, EveryOpOverEveryDimSet) {
  check_all_reductions(random_tensor({3, 4, 5}, DType::f64, 1, -2, 2), 1e-12, 1e-12);
  check_all_reductions(random_tensor({3, 4, 5}, DType::f32, 2, -2, 2), 1e-5, 1e-5);
  check_all_reductions(random_tensor({3, 4, 5}, DType::bf16, 3, -2, 2), 5e-2, 1e-2);
}

TEST(Reduce, NonContiguousInputs) {
  Tensor base = random_tensor({6, 5, 8}, DType::f64, 4, -2, 2);
  check_all_reductions(raw::permute(base, {2, 0, 1}), 1e-12, 1e-12);
  check_all_reductions(raw::slice(base, 2, 1, 8, 3), 1e-12, 1e-12);
  check_all_reductions(raw::expand(raw::narrow(base, 0, 1, 1), {4, 5, 8}), 1e-12, 1e-12);
  check_all_reductions(raw::unsqueeze(raw::transpose(raw::select(base, 1, 2), 0, 1), 1), 1e-12, 1e-12);  // (8, 1, 6)
}

TEST(Reduce, LargeInputsTakeTheParallelPath) {
  // kept * reduced > 1<<16 with several kept rows, and one huge row.
  Tensor x = random_tensor({64, 40, 50}, DType::f32, 5, -1, 1);
  for (const auto& dims : std::vector<std::vector<int64_t>>{{2}, {0}, {0, 2}, {}}) {
    const NaiveReduction s = naive_sum(x, dims, false);
    EXPECT_TRUE(all_close(raw::sum(x, dims), from_vector<double>(s.values, s.shape), 1e-3, 1e-4));
    const NaiveReduction m = naive_amax(x, dims, true);
    EXPECT_TRUE(all_close(raw::amax(x, dims, true), from_vector<double>(m.values, m.shape), 0, 0));
  }
  Tensor t = raw::transpose(random_tensor({300, 400}, DType::f64, 6), 0, 1);
  const NaiveReduction lse = naive_logsumexp(t, {1}, false);
  EXPECT_TRUE(all_close(raw::logsumexp(t, {1}), from_vector<double>(lse.values, lse.shape), 1e-12, 1e-12));
  const NaiveReduction mean = naive_mean(t, {0}, true);
  EXPECT_TRUE(all_close(raw::mean(t, {0}, true), from_vector<double>(mean.values, mean.shape), 1e-12, 1e-12));
}

TEST(Reduce, ScalarsAndEmptyDims) {
  Tensor s = scalar_tensor(2.5, {.dtype = DType::f64});
  EXPECT_EQ(raw::sum(s).dim(), 0);
  EXPECT_EQ(raw::sum(s).item<double>(), 2.5);
  EXPECT_EQ(raw::sum(s, {0}).item<double>(), 2.5) << "dim 0 of a scalar is accepted, as in PyTorch";
  EXPECT_EQ(raw::mean(s, {-1}, true).item<double>(), 2.5);
  EXPECT_EQ(raw::amax(s, {0}).item<double>(), 2.5);
  EXPECT_EQ(raw::argmax(s, 0).item<int64_t>(), 0);
  EXPECT_EQ(raw::logsumexp(s).item<double>(), 2.5);

  Tensor e = zeros({2, 0, 3}, {.dtype = DType::f64});
  EXPECT_EQ(raw::sum(e, {1}).shape(), (Shape{2, 3}));
  EXPECT_EQ(raw::sum(e, {1}).to_vector<double>(), std::vector<double>(6, 0.0));
  for (double v : raw::mean(e, {1}).to_vector<double>()) EXPECT_TRUE(std::isnan(v));
  EXPECT_EQ(raw::logsumexp(e, {1}).to_vector<double>(), std::vector<double>(6, -INFINITY));
  EXPECT_EQ(raw::sum(e, {0}).shape(), (Shape{0, 3}));
  EXPECT_EQ(raw::amax(e, {0}, true).shape(), (Shape{1, 0, 3}));
  EXPECT_EQ(raw::sum(e).item<double>(), 0.0);
  EXPECT_CPF_ERROR(raw::amax(e, {1}), "amax: cannot reduce over dim 1 of size 0 (shape [2,0,3])");
  EXPECT_CPF_ERROR(raw::amax(e), "amax: cannot reduce over dim 1 of size 0");
  EXPECT_CPF_ERROR(raw::argmax(e, 1), "argmax: dim 1 has size 0 (shape [2,0,3])");
}

TEST(Reduce, LogsumexpIsStable) {
  Tensor x = from_vector<double>({1000, 1000, -1000, -1000, -INFINITY, -INFINITY, INFINITY, 0, NAN, 1}, {5, 2});
  const auto v = raw::logsumexp(x, {1}).to_vector<double>();
  EXPECT_DOUBLE_EQ(v[0], 1000 + std::log(2.0));
  EXPECT_DOUBLE_EQ(v[1], -1000 + std::log(2.0));
  EXPECT_EQ(v[2], -INFINITY) << "a row of -inf stays -inf instead of NaN";
  EXPECT_EQ(v[3], INFINITY);
  EXPECT_TRUE(std::isnan(v[4]));
  Tensor f = from_vector<float>({88, 89, 90}, {3});  // exp overflows in f32 without the shift
  EXPECT_NEAR(raw::logsumexp(f).item<double>(), 90 + std::log(1 + std::exp(-1.0) + std::exp(-2.0)), 1e-4);
}

TEST(Reduce, AmaxPropagatesNaN) {
  Tensor x = from_vector<float>({1, NAN, 3, 4, 5, 6}, {2, 3});
  const auto v = raw::amax(x, {1}).to_vector<float>();
  EXPECT_TRUE(std::isnan(v[0]));
  EXPECT_EQ(v[1], 6.0f);
  EXPECT_TRUE(std::isnan(raw::amax(x).item<float>()));
}

TEST(Argmax, FirstMaximumAlongOneDim) {
  Tensor x = from_vector<double>({1, 5, 5, 2, 7, 0, 7, 3, -1, -1, -1, -1}, {3, 4});
  EXPECT_EQ(raw::argmax(x, 1).to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 0}));
  EXPECT_EQ(raw::argmax(x, -1, true).shape(), (Shape{3, 1}));
  EXPECT_EQ(raw::argmax(x, 0).to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 1, 1}));
  EXPECT_EQ(raw::argmax(x, 0).dtype(), DType::i64);
  // Against a naive loop on a random non-contiguous f32 / bf16 input.
  for (DType dtype : {DType::f32, DType::bf16}) {
    Tensor r = raw::transpose(random_tensor({7, 6, 5}, dtype, 8), 0, 2);  // (5, 6, 7)
    const auto rv = r.to_vector<double>();
    for (int64_t dim = 0; dim < 3; ++dim) {
      const auto got = raw::argmax(r, dim).to_vector<int64_t>();
      size_t k = 0;
      for (int64_t i = 0; i < 5; ++i) {
        for (int64_t j = 0; j < 6; ++j) {
          for (int64_t l = 0; l < 7; ++l) {
            const int64_t idx[3] = {i, j, l};
            if (idx[dim] != 0) continue;
            int64_t best = 0;
            double best_v = -INFINITY;
            for (int64_t t = 0; t < r.size(dim); ++t) {
              int64_t c[3] = {i, j, l};
              c[dim] = t;
              const double v = rv[static_cast<size_t>((c[0] * 6 + c[1]) * 7 + c[2])];
              if (v > best_v) {
                best_v = v;
                best = t;
              }
            }
            ASSERT_EQ(got[k++], best) << "dim " << dim;
          }
        }
      }
    }
  }
  EXPECT_CPF_ERROR(raw::argmax(x, 2), "argmax: dim 2 out of range for a tensor of rank 2 (expected -2..1)");
  EXPECT_CPF_ERROR(raw::argmax(zeros({2}, {.dtype = DType::i64}), 0), "argmax: needs a floating tensor, got i64");
}

TEST(SumTo, ReducesBroadcastDims) {
  Tensor x = random_tensor({2, 3, 4}, DType::f64, 9);
  const std::vector<std::pair<Shape, std::vector<int64_t>>> cases{
      {{3, 4}, {0}},   {{3, 1}, {0, 2}}, {{1, 4}, {0, 1}},      {{4}, {0, 1}},
      {{}, {0, 1, 2}}, {{2, 1, 4}, {1}}, {{1, 1, 1}, {0, 1, 2}}};
  for (const auto& [target, dims] : cases) {
    Tensor y = raw::sum_to(x, target);
    EXPECT_EQ(y.shape(), target);
    const NaiveReduction ref = naive_sum(x, dims, false);
    EXPECT_EQ(shape_numel(ref.shape), shape_numel(target));
    EXPECT_TRUE(all_close(raw::reshape(y, ref.shape), from_vector<double>(ref.values, ref.shape), 1e-14, 1e-14))
        << shape_str(target);
  }
  EXPECT_TRUE(raw::sum_to(x, {2, 3, 4}).is_same(x));
  EXPECT_CPF_ERROR(raw::sum_to(x, {5}), "sum_to: shapes [5] and [2,3,4] are not broadcastable");
  EXPECT_CPF_ERROR(raw::sum_to(raw::sum(x, {0}), {2, 1, 4}), "sum_to: [3,4] is not a broadcast of [2,1,4]");
}

TEST(Reduce, Errors) {
  Tensor x = zeros({2, 3, 4});
  EXPECT_CPF_ERROR(raw::sum(x, {3}), "sum: dim 3 out of range for a tensor of rank 3 (expected -3..2)");
  EXPECT_CPF_ERROR(raw::mean(x, {-4}), "mean: dim -4 out of range for a tensor of rank 3");
  EXPECT_CPF_ERROR(raw::mean(x, {1, -2}), "mean: dims [1,-2] repeat a dimension");
  EXPECT_CPF_ERROR(raw::logsumexp(x, {0, 0}), "logsumexp: dims [0,0] repeat a dimension");
  EXPECT_CPF_ERROR(raw::amax(x, {5}), "amax: dim 5 out of range");
  EXPECT_CPF_ERROR(raw::sum(zeros({2}, {.dtype = DType::i32})), "sum: needs a floating tensor, got i32");
  EXPECT_CPF_ERROR(raw::mean(zeros({2}, {.dtype = DType::boolean})), "mean: needs a floating tensor, got bool");
  EXPECT_CPF_ERROR(raw::sum(Tensor()), "sum: argument 'x' is an undefined tensor");
  EXPECT_CPF_ERROR(raw::sum(scalar_tensor(1.0), {1}), "sum: dim 1 out of range for a tensor of rank 0");
}

}  // namespace
}  // namespace cpf
