#include "framework/tensor/ops/softmax.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/views.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

using testing::all_close;
using testing::random_tensor;

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Layout {
  int64_t outer = 1, size = 1, inner = 1;
};

Layout layout_of(const Shape& shape, int64_t dim) {
  Layout l;
  for (int64_t k = 0; k < static_cast<int64_t>(shape.size()); ++k) {
    if (k < dim)
      l.outer *= shape[k];
    else if (k == dim)
      l.size = shape[k];
    else
      l.inner *= shape[k];
  }
  return l;
}

int64_t norm_dim(int64_t dim, const Shape& shape) { return dim < 0 ? dim + static_cast<int64_t>(shape.size()) : dim; }

// Plain loops in double: every (outer, inner) column along `dim` separately.
Tensor reference_softmax(const Tensor& x, int64_t dim, bool log) {
  const auto v = x.to_vector<double>();
  const Shape& shape = x.shape();
  const Layout l = layout_of(shape, norm_dim(dim, shape));
  std::vector<double> out(v.size());
  for (int64_t o = 0; o < l.outer; ++o) {
    for (int64_t j = 0; j < l.inner; ++j) {
      auto at = [&](int64_t d) { return static_cast<size_t>((o * l.size + d) * l.inner + j); };
      double m = -kInf;
      for (int64_t d = 0; d < l.size; ++d) m = std::max(m, v[at(d)]);
      if (m == -kInf) {
        for (int64_t d = 0; d < l.size; ++d) out[at(d)] = log ? -kInf : 0.0;
        continue;
      }
      double s = 0;
      for (int64_t d = 0; d < l.size; ++d) s += std::exp(v[at(d)] - m);
      for (int64_t d = 0; d < l.size; ++d) {
        out[at(d)] = log ? v[at(d)] - m - std::log(s) : std::exp(v[at(d)] - m) / s;
      }
    }
  }
  return from_vector(out, shape);
}

Tensor reference_backward(const Tensor& grad, const Tensor& y, int64_t dim, bool log) {
  const auto g = grad.to_vector<double>();
  const auto yv = y.to_vector<double>();
  const Shape& shape = y.shape();
  const Layout l = layout_of(shape, norm_dim(dim, shape));
  std::vector<double> out(g.size());
  for (int64_t o = 0; o < l.outer; ++o) {
    for (int64_t j = 0; j < l.inner; ++j) {
      auto at = [&](int64_t d) { return static_cast<size_t>((o * l.size + d) * l.inner + j); };
      double s = 0;
      for (int64_t d = 0; d < l.size; ++d) s += log ? g[at(d)] : g[at(d)] * yv[at(d)];
      for (int64_t d = 0; d < l.size; ++d) {
        out[at(d)] = log ? g[at(d)] - std::exp(yv[at(d)]) * s : yv[at(d)] * (g[at(d)] - s);
      }
    }
  }
  return from_vector(out, shape);
}

void expect_forward_matches(const Tensor& x, int64_t dim, double atol, double rtol) {
  const Tensor y = raw::softmax(x, dim);
  const Tensor ly = raw::log_softmax(x, dim);
  EXPECT_EQ(y.dtype(), x.dtype());
  EXPECT_EQ(ly.dtype(), x.dtype());
  EXPECT_TRUE(y.is_contiguous());
  EXPECT_TRUE(all_close(y, reference_softmax(x, dim, false), atol, rtol))
      << "softmax dim " << dim << " " << shape_str(x.shape());
  EXPECT_TRUE(all_close(ly, reference_softmax(x, dim, true), atol, rtol))
      << "log_softmax dim " << dim << " " << shape_str(x.shape());
}

TEST(Softmax, LastDimMatchesReference) {
  for (DType dtype : {DType::f32, DType::f64}) {
    const double tol = dtype == DType::f32 ? 1e-5 : 1e-12;
    expect_forward_matches(random_tensor({7, 33}, dtype, 1, -5, 5), -1, tol, tol);
    expect_forward_matches(random_tensor({2, 3, 17}, dtype, 2, -5, 5), 2, tol, tol);
    // Large enough for the threaded path.
    expect_forward_matches(random_tensor({64, 1000}, dtype, 3, -8, 8), 1, tol, tol);
    expect_forward_matches(random_tensor({5}, dtype, 4), 0, tol, tol);
  }
}

TEST(Softmax, NonLastDimMatchesReference) {
  for (DType dtype : {DType::f32, DType::f64}) {
    const double tol = dtype == DType::f32 ? 1e-5 : 1e-12;
    const Tensor x = random_tensor({3, 5, 4}, dtype, 5, -4, 4);
    expect_forward_matches(x, 0, tol, tol);
    expect_forward_matches(x, 1, tol, tol);
    expect_forward_matches(x, -2, tol, tol);
    // Threaded, with an inner extent wider than one column group (and a ragged last group).
    expect_forward_matches(random_tensor({2, 100, 700}, dtype, 6, -4, 4), 1, tol, tol);
    expect_forward_matches(random_tensor({300, 3, 50}, dtype, 7, -4, 4), 0, tol, tol);
  }
}

TEST(Softmax, NonContiguousInputs) {
  const Tensor base = random_tensor({6, 9}, DType::f32, 8, -3, 3);
  const Tensor t = raw::transpose(base, 0, 1);  // (9, 6), strides (1, 9)
  ASSERT_FALSE(t.is_contiguous());
  expect_forward_matches(t, -1, 1e-6, 1e-5);
  expect_forward_matches(t, 0, 1e-6, 1e-5);
  const Tensor sliced = raw::slice(random_tensor({4, 20}, DType::f64, 9), 1, 1, 20, 3);  // (4, 7), stride 3
  ASSERT_FALSE(sliced.is_contiguous());
  expect_forward_matches(sliced, 1, 1e-12, 1e-12);
  expect_forward_matches(sliced, 0, 1e-12, 1e-12);
}

TEST(Softmax, Bf16ComputesInF32) {
  const Tensor x = raw::to(random_tensor({8, 40}, DType::f32, 10, -4, 4), DType::bf16);
  expect_forward_matches(x, -1, 1e-2, 2e-2);
  expect_forward_matches(x, 0, 1e-2, 2e-2);
}

TEST(Softmax, LargeLogitsDoNotOverflow) {
  const Tensor x = from_vector<float>({1000.f, 1001.f, 999.f, -1000.f, -1001.f, -999.f}, {2, 3});
  const auto y = raw::softmax(x, 1).to_vector<double>();
  const double e0 = std::exp(-1.0), e2 = std::exp(-2.0), z = 1 + e0 + e2;
  const std::vector<double> expected{e0 / z, 1 / z, e2 / z, e0 / z, e2 / z, 1 / z};
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], expected[i], 1e-6) << i;
  EXPECT_TRUE(all_close(raw::log_softmax(x, 1), reference_softmax(x, 1, true), 1e-4, 1e-6));
}

TEST(Softmax, FullyMaskedRowsGiveZeroAndMinusInf) {
  // Row 0 fully masked, row 1 partly masked, row 2 plain.
  const Tensor x = from_vector<double>({-kInf, -kInf, -kInf, 0.5, -kInf, 1.5, 1, 2, 3}, {3, 3});
  for (DType dtype : {DType::f32, DType::f64, DType::bf16}) {
    const Tensor xd = raw::to(x, dtype);
    for (int64_t dim : {1, 0}) {  // dim 0 exercises the column-group path (column 1 masked except row 2)
      const Tensor xi = dim == 1 ? xd : raw::contiguous(raw::transpose(xd, 0, 1));
      const Tensor y = raw::softmax(xi, dim);
      const Tensor ly = raw::log_softmax(xi, dim);
      for (double v : y.to_vector<double>()) EXPECT_FALSE(std::isnan(v));
      for (double v : ly.to_vector<double>()) EXPECT_FALSE(std::isnan(v));
      EXPECT_TRUE(all_close(y, reference_softmax(xi, dim, false), 1e-2, 1e-2));
      EXPECT_TRUE(all_close(ly, reference_softmax(xi, dim, true), 1e-2, 1e-2));
    }
  }
  const Tensor all_masked = full({2, 5, 3}, -kInf, {.dtype = DType::f32});
  for (int64_t dim : {0, 1, 2}) {
    for (double v : raw::softmax(all_masked, dim).to_vector<double>()) EXPECT_EQ(v, 0.0);
    for (double v : raw::log_softmax(all_masked, dim).to_vector<double>()) EXPECT_EQ(v, -kInf);
  }
}

TEST(Softmax, MaskedEntriesAreExactlyZero) {
  // Rows long enough for the vectorised exp: masked entries must be exact zeros, not exp's underflow.
  for (DType dtype : {DType::f32, DType::f64}) {
    std::vector<double> v(4 * 64);
    for (size_t i = 0; i < v.size(); ++i) {
      v[i] = i % 3 == 0 ? -kInf : static_cast<double>(i % 7) * 0.3 - 200.0 * static_cast<double>(i % 2);
    }
    const Tensor x = raw::to(from_vector(v, {4, 64}), dtype);
    const Tensor g = random_tensor({4, 64}, dtype, 17);
    const auto y = raw::softmax(x, 1).to_vector<double>();
    const auto yt = raw::softmax(raw::contiguous(raw::transpose(x, 0, 1)), 0).to_vector<double>();  // (64, 4)
    const auto dx = raw::log_softmax_backward(g, raw::log_softmax(x, 1), 1).to_vector<double>();
    const auto gv = g.to_vector<double>();
    for (int64_t r = 0; r < 4; ++r) {
      for (int64_t c = 0; c < 64; ++c) {
        const size_t i = static_cast<size_t>(r * 64 + c), it = static_cast<size_t>(c * 4 + r);
        if (v[i] == -kInf) {
          EXPECT_EQ(y[i], 0.0) << i;
          EXPECT_EQ(yt[it], 0.0) << i;
          EXPECT_EQ(dx[i], gv[i]) << i;
        } else {
          EXPECT_NEAR(y[i], yt[it], 1e-6 * y[i]) << i;
        }
      }
    }
  }
}

TEST(Softmax, NanPropagatesToItsRow) {
  std::vector<float> v(3 * 40, 0.25f);
  v[40 + 17] = NAN;
  const Tensor long_rows = from_vector(v, {3, 40});
  for (const Tensor& y : {raw::softmax(long_rows, 1), raw::log_softmax(long_rows, 1),
                          raw::transpose(raw::softmax(raw::contiguous(raw::transpose(long_rows, 0, 1)), 0), 0, 1)}) {
    const auto values = y.to_vector<double>();
    for (size_t i = 0; i < values.size(); ++i) EXPECT_EQ(std::isnan(values[i]), i / 40 == 1) << i;
  }

  const Tensor x = from_vector<float>({1, NAN, 2, 1, 2, 3}, {2, 3});
  const auto y = raw::softmax(x, 1).to_vector<double>();
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(std::isnan(y[i])) << i;
  for (int i = 3; i < 6; ++i) EXPECT_FALSE(std::isnan(y[i])) << i;
  const auto yc = raw::softmax(raw::contiguous(raw::transpose(x, 0, 1)), 0).to_vector<double>();  // (3, 2)
  for (int i : {0, 2, 4}) EXPECT_TRUE(std::isnan(yc[i])) << i;
  for (int i : {1, 3, 5}) EXPECT_FALSE(std::isnan(yc[i])) << i;
}

TEST(Softmax, EmptyAndScalarInputs) {
  EXPECT_EQ(raw::softmax(zeros({0, 4}), 1).shape(), (Shape{0, 4}));
  EXPECT_EQ(raw::log_softmax(zeros({3, 0}), 1).shape(), (Shape{3, 0}));
  EXPECT_EQ(raw::softmax(scalar_tensor(2.5), 0).item<double>(), 1.0);
  EXPECT_EQ(raw::log_softmax(scalar_tensor(2.5), -1).item<double>(), 0.0);
}

TEST(SoftmaxBackward, MatchesReference) {
  for (DType dtype : {DType::f32, DType::f64}) {
    const double tol = dtype == DType::f32 ? 1e-5 : 1e-12;
    for (const Shape& shape : {Shape{6, 11}, Shape{3, 5, 4}, Shape{64, 700}, Shape{2, 300, 60}}) {
      const Tensor x = random_tensor(shape, dtype, 11, -3, 3);
      const Tensor g = random_tensor(shape, dtype, 12);
      for (int64_t dim : {int64_t{-1}, int64_t{1}}) {
        const Tensor y = raw::softmax(x, dim);
        const Tensor ly = raw::log_softmax(x, dim);
        EXPECT_TRUE(all_close(raw::softmax_backward(g, y, dim), reference_backward(g, y, dim, false), tol, tol))
            << shape_str(shape) << " dim " << dim;
        EXPECT_TRUE(all_close(raw::log_softmax_backward(g, ly, dim), reference_backward(g, ly, dim, true), tol, tol))
            << shape_str(shape) << " dim " << dim;
      }
    }
  }
}

TEST(SoftmaxBackward, NonContiguousAndBf16) {
  const Tensor x = random_tensor({5, 8}, DType::f64, 13);
  const Tensor g = raw::transpose(random_tensor({8, 5}, DType::f64, 14), 0, 1);
  ASSERT_FALSE(g.is_contiguous());
  const Tensor y = raw::softmax(x, 1);
  EXPECT_TRUE(all_close(raw::softmax_backward(g, y, 1), reference_backward(g, y, 1, false), 1e-12, 1e-12));
  const Tensor gb = raw::to(random_tensor({5, 8}, DType::f32, 15), DType::bf16);
  const Tensor yb = raw::to(raw::log_softmax(x, 0), DType::bf16);
  const Tensor dx = raw::log_softmax_backward(gb, yb, 0);
  EXPECT_EQ(dx.dtype(), DType::bf16);
  EXPECT_TRUE(all_close(dx, reference_backward(gb, yb, 0, true), 2e-2, 2e-2));
}

TEST(SoftmaxBackward, MaskedRowsStayFinite) {
  const Tensor x = full({2, 4}, -kInf, {.dtype = DType::f32});
  const Tensor g = random_tensor({2, 4}, DType::f32, 16);
  for (double v : raw::softmax_backward(g, raw::softmax(x, 1), 1).to_vector<double>()) EXPECT_EQ(v, 0.0);
  EXPECT_TRUE(all_close(raw::log_softmax_backward(g, raw::log_softmax(x, 1), 1), g, 0, 0));
  EXPECT_TRUE(all_close(raw::log_softmax_backward(g, raw::log_softmax(x, 0), 0), g, 0, 0));
}

TEST(Softmax, RejectsBadInputs) {
  const Tensor x = random_tensor({2, 3}, DType::f32);
  EXPECT_CPF_ERROR(raw::softmax(Tensor(), 0), "softmax: argument 'x' is an undefined tensor");
  EXPECT_CPF_ERROR(raw::softmax(zeros({2, 3}, {.dtype = DType::i64}), 1),
                   "softmax: 'x' must be a floating tensor (f32, f64 or bf16), got i64");
  EXPECT_CPF_ERROR(raw::softmax(x, 2), "softmax: dim 2 out of range for a tensor of rank 2");
  EXPECT_CPF_ERROR(raw::log_softmax(x, -3), "log_softmax: dim -3 out of range for a tensor of rank 2");
  EXPECT_CPF_ERROR(raw::log_softmax(zeros({2}, {.dtype = DType::i32}), 0),
                   "log_softmax: 'x' must be a floating tensor");
  EXPECT_CPF_ERROR(raw::softmax_backward(random_tensor({2, 4}, DType::f32), x, 1),
                   "softmax_backward: grad_y of shape [2,4] does not match y of shape [2,3]");
  EXPECT_CPF_ERROR(raw::log_softmax_backward(random_tensor({2, 3}, DType::f64), x, 1),
                   "log_softmax_backward: dtypes differ");
  EXPECT_CPF_ERROR(raw::softmax_backward(x, Tensor(), 1), "softmax_backward: argument 'y' is an undefined tensor");
  EXPECT_CPF_ERROR(raw::softmax_backward(x, x, 5), "softmax_backward: dim 5 out of range");
}

}  // namespace
}  // namespace cpf
