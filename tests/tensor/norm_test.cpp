#include "framework/tensor/ops/norm.h"

#include <gtest/gtest.h>

#include <cmath>
#if defined(CPF_WITH_OPENMP)
#include <omp.h>
#endif

#include "framework/tensor/ops/views.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

using testing::all_close;
using testing::random_tensor;

struct Reference {
  Tensor y, mean, rstd;       // forward
  Tensor dx, dweight, dbias;  // backward (when a gradient is given)
};

// Plain loops in double, textbook formulas. centered = LayerNorm, otherwise RMSNorm.
Reference reference_norm(bool centered, const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                         const Tensor& grad = Tensor()) {
  const int64_t cols = x.size(-1), rows = x.numel() / cols;
  const auto xv = x.to_vector<double>();
  const auto wv = weight.defined() ? weight.to_vector<double>() : std::vector<double>(cols, 1.0);
  const auto bv = bias.defined() ? bias.to_vector<double>() : std::vector<double>(cols, 0.0);
  const auto gv = grad.defined() ? grad.to_vector<double>() : std::vector<double>();
  std::vector<double> y(xv.size()), mean(rows), rstd(rows), dx(xv.size()), dw(cols, 0.0), db(cols, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const double* xr = xv.data() + r * cols;
    double mu = 0, var = 0;
    if (centered) {
      for (int64_t c = 0; c < cols; ++c) mu += xr[c];
      mu /= cols;
    }
    for (int64_t c = 0; c < cols; ++c) var += (xr[c] - mu) * (xr[c] - mu);
    var /= cols;
    const double rs = 1.0 / std::sqrt(var + eps);
    mean[r] = mu;
    rstd[r] = rs;
    for (int64_t c = 0; c < cols; ++c) y[r * cols + c] = (xr[c] - mu) * rs * wv[c] + bv[c];
    if (gv.empty()) continue;
    // dx_c = rs * (gh_c - mean(gh) - xhat_c * mean(gh * xhat)), gh = g * w (mean(gh) term only when centered).
    double mean_gh = 0, mean_ghx = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const double gh = gv[r * cols + c] * wv[c];
      const double xhat = (xr[c] - mu) * rs;
      mean_gh += gh / cols;
      mean_ghx += gh * xhat / cols;
      dw[c] += gv[r * cols + c] * xhat;
      db[c] += gv[r * cols + c];
    }
    for (int64_t c = 0; c < cols; ++c) {
      const double gh = gv[r * cols + c] * wv[c];
      const double xhat = (xr[c] - mu) * rs;
      dx[r * cols + c] = rs * (gh - (centered ? mean_gh : 0.0) - xhat * mean_ghx);
    }
  }
  const Shape stat(x.shape().begin(), x.shape().end() - 1);
  Reference ref{from_vector(y, x.shape()), from_vector(mean, stat), from_vector(rstd, stat)};
  if (!gv.empty()) {
    ref.dx = from_vector(dx, x.shape());
    ref.dweight = from_vector(dw, {cols});
    ref.dbias = from_vector(db, {cols});
  }
  return ref;
}

double tol_for(DType dtype) { return dtype == DType::f64 ? 1e-11 : 2e-5; }

TEST(LayerNorm, ForwardMatchesReference) {
  for (DType dtype : {DType::f32, DType::f64}) {
    const double tol = tol_for(dtype);
    for (const Shape& shape : {Shape{4, 7}, Shape{2, 3, 33}, Shape{256, 300}, Shape{5}}) {
      const int64_t cols = shape.back();
      const Tensor x = random_tensor(shape, dtype, 1, -2, 3);
      const Tensor w = random_tensor({cols}, dtype, 2, 0.5, 1.5);
      const Tensor b = random_tensor({cols}, dtype, 3);
      for (int affine = 0; affine < 4; ++affine) {
        const Tensor wi = affine & 1 ? w : Tensor(), bi = affine & 2 ? b : Tensor();
        const auto r = raw::layer_norm(x, wi, bi, 1e-5);
        const Reference ref = reference_norm(true, x, wi, bi, 1e-5);
        EXPECT_EQ(r.y.dtype(), dtype);
        EXPECT_EQ(r.mean.dtype(), dtype);
        EXPECT_TRUE(all_close(r.y, ref.y, tol, tol)) << shape_str(shape) << " affine " << affine;
        EXPECT_TRUE(all_close(r.mean, ref.mean, tol, tol)) << shape_str(shape);
        EXPECT_TRUE(all_close(r.rstd, ref.rstd, tol, tol)) << shape_str(shape);
      }
    }
  }
}

TEST(LayerNorm, BackwardMatchesReference) {
  for (DType dtype : {DType::f32, DType::f64}) {
    const double tol = tol_for(dtype) * 10;
    for (const Shape& shape : {Shape{4, 7}, Shape{2, 3, 33}, Shape{256, 300}}) {
      const int64_t cols = shape.back();
      const Tensor x = random_tensor(shape, dtype, 4, -2, 3);
      const Tensor g = random_tensor(shape, dtype, 5);
      const Tensor w = random_tensor({cols}, dtype, 6, 0.5, 1.5);
      for (const Tensor& wi : {w, Tensor()}) {
        const auto r = raw::layer_norm(x, wi, Tensor(), 1e-5);
        const auto d = raw::layer_norm_backward(g, x, wi, r.mean, r.rstd);
        const Reference ref = reference_norm(true, x, wi, Tensor(), 1e-5, g);
        EXPECT_TRUE(all_close(d.dx, ref.dx, tol, tol)) << shape_str(shape);
        EXPECT_TRUE(all_close(d.dbias, ref.dbias, tol, tol)) << shape_str(shape);
        EXPECT_EQ(d.dweight.defined(), wi.defined());
        if (wi.defined()) EXPECT_TRUE(all_close(d.dweight, ref.dweight, tol, tol)) << shape_str(shape);
      }
    }
  }
}

TEST(LayerNorm, NonContiguousAndBf16) {
  const Tensor base = random_tensor({9, 6}, DType::f64, 7);
  const Tensor x = raw::transpose(base, 0, 1);  // (6, 9)
  ASSERT_FALSE(x.is_contiguous());
  const Tensor w = random_tensor({9}, DType::f64, 8);
  const Tensor g = raw::transpose(random_tensor({9, 6}, DType::f64, 9), 0, 1);
  const auto r = raw::layer_norm(x, w, w, 1e-6);
  const Reference ref = reference_norm(true, x, w, w, 1e-6, g);
  EXPECT_TRUE(all_close(r.y, ref.y, 1e-12, 1e-12));
  const auto d = raw::layer_norm_backward(g, x, w, r.mean, r.rstd);
  EXPECT_TRUE(all_close(d.dx, ref.dx, 1e-11, 1e-11));
  EXPECT_TRUE(all_close(d.dweight, ref.dweight, 1e-11, 1e-11));

  const Tensor xb = raw::to(random_tensor({8, 64}, DType::f32, 10), DType::bf16);
  const Tensor wb = raw::to(random_tensor({64}, DType::f32, 11), DType::bf16);
  const Tensor gb = raw::to(random_tensor({8, 64}, DType::f32, 12), DType::bf16);
  const auto rb = raw::layer_norm(xb, wb, wb, 1e-5);
  EXPECT_EQ(rb.y.dtype(), DType::bf16);
  EXPECT_EQ(rb.mean.dtype(), DType::f32);
  EXPECT_EQ(rb.rstd.dtype(), DType::f32);
  const Reference refb = reference_norm(true, xb, wb, wb, 1e-5, gb);
  EXPECT_TRUE(all_close(rb.y, refb.y, 2e-2, 2e-2));
  const auto db = raw::layer_norm_backward(gb, xb, wb, rb.mean, rb.rstd);
  EXPECT_EQ(db.dx.dtype(), DType::bf16);
  EXPECT_EQ(db.dweight.dtype(), DType::bf16);
  EXPECT_TRUE(all_close(db.dx, refb.dx, 5e-2, 2e-2));
  EXPECT_TRUE(all_close(db.dweight, refb.dweight, 5e-2, 2e-2));
  EXPECT_TRUE(all_close(db.dbias, refb.dbias, 5e-2, 2e-2));
}

TEST(LayerNorm, ConstantRowsAreFinite) {
  // var = 0: rstd = 1/sqrt(eps), y = bias, no NaN.
  const Tensor x = full({3, 16}, 2.5, {.dtype = DType::f64});
  const Tensor b = random_tensor({16}, DType::f64, 13);
  const auto r = raw::layer_norm(x, Tensor(), b, 1e-5);
  EXPECT_TRUE(all_close(r.y, raw::expand(b, {3, 16}), 1e-12, 0));
  EXPECT_NEAR(r.rstd.to_vector<double>()[0], 1.0 / std::sqrt(1e-5), 1e-6);
}

TEST(LayerNorm, ParameterGradientsDoNotDependOnThreadCount) {
#if defined(CPF_WITH_OPENMP)
  const Tensor x = random_tensor({512, 384}, DType::f32, 14);
  const Tensor g = random_tensor({512, 384}, DType::f32, 15);
  const Tensor w = random_tensor({384}, DType::f32, 16);
  const auto r = raw::layer_norm(x, w, w, 1e-5);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto one = raw::layer_norm_backward(g, x, w, r.mean, r.rstd);
  omp_set_num_threads(std::max(saved, 3));
  const auto many = raw::layer_norm_backward(g, x, w, r.mean, r.rstd);
  omp_set_num_threads(saved);
  EXPECT_EQ(one.dweight.to_vector<float>(), many.dweight.to_vector<float>());
  EXPECT_EQ(one.dbias.to_vector<float>(), many.dbias.to_vector<float>());
  EXPECT_EQ(one.dx.to_vector<float>(), many.dx.to_vector<float>());
#else
  GTEST_SKIP() << "built without OpenMP";
#endif
}

TEST(RmsNorm, ForwardAndBackwardMatchReference) {
  for (DType dtype : {DType::f32, DType::f64}) {
    const double tol = tol_for(dtype);
    for (const Shape& shape : {Shape{4, 7}, Shape{2, 3, 33}, Shape{256, 300}}) {
      const int64_t cols = shape.back();
      const Tensor x = random_tensor(shape, dtype, 17, -2, 3);
      const Tensor g = random_tensor(shape, dtype, 18);
      const Tensor w = random_tensor({cols}, dtype, 19, 0.5, 1.5);
      for (const Tensor& wi : {w, Tensor()}) {
        const auto r = raw::rms_norm(x, wi, 1e-6);
        const Reference ref = reference_norm(false, x, wi, Tensor(), 1e-6, g);
        EXPECT_EQ(r.y.dtype(), dtype);
        EXPECT_TRUE(all_close(r.y, ref.y, tol, tol)) << shape_str(shape);
        EXPECT_TRUE(all_close(r.rstd, ref.rstd, tol, tol)) << shape_str(shape);
        const auto d = raw::rms_norm_backward(g, x, wi, r.rstd);
        EXPECT_TRUE(all_close(d.dx, ref.dx, tol * 10, tol * 10)) << shape_str(shape);
        EXPECT_FALSE(d.dbias.defined());
        EXPECT_EQ(d.dweight.defined(), wi.defined());
        if (wi.defined()) EXPECT_TRUE(all_close(d.dweight, ref.dweight, tol * 10, tol * 10)) << shape_str(shape);
      }
    }
  }
}

TEST(RmsNorm, NonContiguousAndBf16) {
  const Tensor x = raw::slice(random_tensor({5, 24}, DType::f64, 20), 1, 0, 24, 2);  // (5, 12), stride 2
  ASSERT_FALSE(x.is_contiguous());
  const Tensor w = random_tensor({12}, DType::f64, 21);
  const Tensor g = random_tensor({5, 12}, DType::f64, 22);
  const auto r = raw::rms_norm(x, w, 1e-6);
  const Reference ref = reference_norm(false, x, w, Tensor(), 1e-6, g);
  EXPECT_TRUE(all_close(r.y, ref.y, 1e-12, 1e-12));
  EXPECT_TRUE(all_close(raw::rms_norm_backward(g, x, w, r.rstd).dx, ref.dx, 1e-11, 1e-11));
  const Tensor xb = raw::to(x, DType::bf16), wb = raw::to(w, DType::bf16);
  const auto rb = raw::rms_norm(xb, wb, 1e-6);
  EXPECT_EQ(rb.y.dtype(), DType::bf16);
  EXPECT_EQ(rb.rstd.dtype(), DType::f32);
  EXPECT_TRUE(all_close(rb.y, reference_norm(false, xb, wb, Tensor(), 1e-6).y, 2e-2, 2e-2));
}

TEST(Norm, RejectsBadInputs) {
  const Tensor x = random_tensor({2, 4}, DType::f32);
  const Tensor w = random_tensor({4}, DType::f32);
  EXPECT_CPF_ERROR(raw::layer_norm(Tensor(), w, w), "layer_norm: argument 'x' is an undefined tensor");
  EXPECT_CPF_ERROR(raw::layer_norm(zeros({2, 4}, {.dtype = DType::i32}), Tensor(), Tensor()),
                   "layer_norm: x must be a floating tensor (f32, f64 or bf16), got i32");
  EXPECT_CPF_ERROR(raw::rms_norm(scalar_tensor(1.0), Tensor()),
                   "rms_norm: x must have at least one dim (the normalised one), got a scalar");
  EXPECT_CPF_ERROR(raw::layer_norm(zeros({3, 0}), Tensor(), Tensor()),
                   "layer_norm: the normalised (last) dim of x is empty, shape [3,0]");
  EXPECT_CPF_ERROR(raw::layer_norm(x, random_tensor({5}, DType::f32), w),
                   "layer_norm: weight must have shape [4] (the last dim of x [2,4]), got [5]");
  EXPECT_CPF_ERROR(raw::layer_norm(x, w, random_tensor({2, 4}, DType::f32)),
                   "layer_norm: bias must have shape [4] (the last dim of x [2,4]), got [2,4]");
  EXPECT_CPF_ERROR(raw::layer_norm(x, w, random_tensor({4}, DType::f64)), "layer_norm: bias is f64 but x is f32");
  EXPECT_CPF_ERROR(raw::rms_norm(x, random_tensor({3}, DType::f32)),
                   "rms_norm: weight must have shape [4] (the last dim of x [2,4]), got [3]");
  EXPECT_CPF_ERROR(raw::layer_norm(x, w, w, -1e-5), "layer_norm: eps must be finite and >= 0, got -1e-05");
  EXPECT_CPF_ERROR(raw::rms_norm(x, w, NAN), "rms_norm: eps must be finite and >= 0, got nan");

  const auto r = raw::layer_norm(x, w, w);
  EXPECT_CPF_ERROR(raw::layer_norm_backward(Tensor(), x, w, r.mean, r.rstd),
                   "layer_norm_backward: argument 'grad_y' is an undefined tensor");
  EXPECT_CPF_ERROR(raw::layer_norm_backward(random_tensor({2, 5}, DType::f32), x, w, r.mean, r.rstd),
                   "layer_norm_backward: grad_y of shape [2,5] does not match x of shape [2,4]");
  EXPECT_CPF_ERROR(raw::layer_norm_backward(random_tensor({2, 4}, DType::f64), x, w, r.mean, r.rstd),
                   "layer_norm_backward: grad_y is f64 but x is f32");
  EXPECT_CPF_ERROR(raw::layer_norm_backward(x, x, w, random_tensor({3}, DType::f32), r.rstd),
                   "layer_norm_backward: mean must have shape [2] (x is [2,4]), got [3]");
  EXPECT_CPF_ERROR(raw::layer_norm_backward(x, x, w, r.mean, Tensor()),
                   "layer_norm_backward: argument 'rstd' is an undefined tensor");
  EXPECT_CPF_ERROR(raw::layer_norm_backward(x, x, w, r.mean, raw::to(r.rstd, DType::f64)),
                   "layer_norm_backward: rstd must be f32 for a f32 x, got f64");
  EXPECT_CPF_ERROR(raw::layer_norm_backward(x, x, random_tensor({2}, DType::f32), r.mean, r.rstd),
                   "layer_norm_backward: weight must have shape [4]");
  const auto rr = raw::rms_norm(x, w);
  EXPECT_CPF_ERROR(raw::rms_norm_backward(x, x, w, random_tensor({2, 1}, DType::f32)),
                   "rms_norm_backward: rstd must have shape [2] (x is [2,4]), got [2,1]");
  EXPECT_CPF_ERROR(raw::rms_norm_backward(random_tensor({4, 2}, DType::f32), x, w, rr.rstd),
                   "rms_norm_backward: grad_y of shape [4,2] does not match x of shape [2,4]");
}

}  // namespace
}  // namespace cpf
