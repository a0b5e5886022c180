#include "framework/tensor/ops/norm.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>

#include "framework/tensor/cpu/compute_types.h"
#include "framework/tensor/cpu/strided_loop.h"
#include "framework/tensor/device_ops.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/profile.h"
#include "framework/tensor/shape_utils.h"

namespace cpf::raw {
namespace {

// LayerNorm and RMSNorm share their kernels: `centered` selects whether the row mean is subtracted
// (LayerNorm) or taken as 0 (RMSNorm, where "var" becomes the mean square).
Shape stat_shape(const Tensor& x) { return Shape(x.shape().begin(), x.shape().end() - 1); }

Tensor prepare(const Tensor& t, DType compute) { return t.defined() ? contiguous(to(t, compute)) : Tensor(); }

void check_x(const Tensor& x, const char* op) {
  check_defined(x, op, "x");
  CPF_CHECK(has_kernel(x.device(), &DeviceOps::norm), op, ": no kernel for device ", x.device(), " in this build");
  CPF_CHECK(is_floating(x.dtype()), op, ": x must be a floating tensor (f32, f64 or bf16), got ", x.dtype());
  CPF_CHECK(x.dim() >= 1, op, ": x must have at least one dim (the normalised one), got a scalar");
  CPF_CHECK(x.size(-1) > 0, op, ": the normalised (last) dim of x is empty, shape ", x.shape());
}

void check_param(const Tensor& p, const Tensor& x, const char* op, const char* name) {
  if (!p.defined()) return;
  CPF_CHECK(p.shape() == Shape{x.size(-1)}, op, ": ", name, " must have shape [", x.size(-1), "] (the last dim of x ",
            x.shape(), "), got ", p.shape());
  CPF_CHECK(p.dtype() == x.dtype(), op, ": ", name, " is ", p.dtype(), " but x is ", x.dtype());
  CPF_CHECK(p.device() == x.device(), op, ": ", name, " is on ", p.device(), " but x is on ", x.device());
}

void check_eps(double eps, const char* op) {
  CPF_CHECK(std::isfinite(eps) && eps >= 0, op, ": eps must be finite and >= 0, got ", eps);
}

void check_grad(const Tensor& grad_y, const Tensor& x, const char* op) {
  check_defined(grad_y, op, "grad_y");
  CPF_CHECK(grad_y.shape() == x.shape(), op, ": grad_y of shape ", grad_y.shape(), " does not match x of shape ",
            x.shape());
  CPF_CHECK(grad_y.dtype() == x.dtype(), op, ": grad_y is ", grad_y.dtype(), " but x is ", x.dtype());
  CPF_CHECK(grad_y.device() == x.device(), op, ": grad_y is on ", grad_y.device(), " but x is on ", x.device());
}

void check_stat(const Tensor& s, const Tensor& x, const char* op, const char* name) {
  check_defined(s, op, name);
  CPF_CHECK(s.shape() == stat_shape(x), op, ": ", name, " must have shape ", stat_shape(x), " (x is ", x.shape(),
            "), got ", s.shape());
  CPF_CHECK(s.dtype() == compute_dtype(x.dtype()), op, ": ", name, " must be ", compute_dtype(x.dtype()), " for a ",
            x.dtype(), " x, got ", s.dtype());
  CPF_CHECK(s.device() == x.device(), op, ": ", name, " is on ", s.device(), " but x is on ", x.device());
}

template <bool centered, class T>
void forward_kernel(const T* x, const T* w, const T* b, T* y, T* mean, T* rstd, int64_t rows, int64_t cols, T eps) {
  const bool parallel = rows > 1 && rows * cols >= cpu::kParallelGrain;
#if defined(CPF_WITH_OPENMP)
#pragma omp parallel for if (parallel) schedule(static)
#endif
  for (int64_t r = 0; r < rows; ++r) {
    CMap<T> xr(x + r * cols, cols);
    Map<T> yr(y + r * cols, cols);
    const T mu = centered ? xr.sum() / T(cols) : T(0);
    // Two passes over a row that sits in cache: no cancellation from E[x^2] - E[x]^2.
    const T var = (xr - mu).square().sum() / T(cols);
    const T rs = T(1) / std::sqrt(var + eps);
    if (centered) mean[r] = mu;
    rstd[r] = rs;
    if (w && b) {
      yr = (xr - mu) * rs * CMap<T>(w, cols) + CMap<T>(b, cols);
    } else if (w) {
      yr = (xr - mu) * rs * CMap<T>(w, cols);
    } else if (b) {
      yr = (xr - mu) * rs + CMap<T>(b, cols);
    } else {
      yr = (xr - mu) * rs;
    }
  }
}

// dx = rstd * (gh - mean(gh) - xhat * mean(gh * xhat)) with gh = grad_y * weight, xhat = (x - mean) * rstd
// (RMSNorm drops the mean(gh) term). dweight = sum_rows grad_y * xhat, dbias = sum_rows grad_y.
template <bool centered, class T>
void backward_kernel(const T* g, const T* x, const T* w, const T* mean, const T* rstd, T* dx, T* dw, T* db,
                     int64_t rows, int64_t cols) {
  const bool parallel = rows * cols >= cpu::kParallelGrain;
#if defined(CPF_WITH_OPENMP)
#pragma omp parallel for if (parallel && rows > 1) schedule(static)
#endif
  for (int64_t r = 0; r < rows; ++r) {
    CMap<T> gr(g + r * cols, cols);
    CMap<T> xr(x + r * cols, cols);
    Map<T> dxr(dx + r * cols, cols);
    const T mu = centered ? mean[r] : T(0);
    const T rs = rstd[r];
    const auto xhat = (xr - mu) * rs;
    auto apply = [&](const auto& gh) {
      const T a = centered ? gh.sum() / T(cols) : T(0);
      const T c = (gh * xhat).sum() / T(cols);
      dxr = rs * (gh - a - xhat * c);
    };
    if (w) {
      apply(gr * CMap<T>(w, cols));
    } else {
      apply(gr);
    }
  }
  if (!dw && !db) return;
  // Parameter gradients: each task owns a group of columns and walks all rows in order, so every
  // sum has the same order whatever the thread count (deterministic, no partial buffers).
  const int64_t group = cpu::column_group(cols, parallel);
  const int64_t groups = (cols + group - 1) / group;
#if defined(CPF_WITH_OPENMP)
#pragma omp parallel for if (parallel && groups > 1) schedule(static)
#endif
  for (int64_t k = 0; k < groups; ++k) {
    const int64_t c0 = k * group;
    const int64_t n = std::min(group, cols - c0);
    if (dw) {
      Map<T> dwg(dw + c0, n);
      dwg.setZero();
      for (int64_t r = 0; r < rows; ++r) {
        const T mu = centered ? mean[r] : T(0);
        dwg += CMap<T>(g + r * cols + c0, n) * (CMap<T>(x + r * cols + c0, n) - mu) * rstd[r];
      }
    }
    if (db) {
      Map<T> dbg(db + c0, n);
      dbg.setZero();
      for (int64_t r = 0; r < rows; ++r) dbg += CMap<T>(g + r * cols + c0, n);
    }
  }
}

// Device path: contiguous inputs in x's dtype; statistics in the compute dtype.
template <bool centered>
LayerNormResult device_forward(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  const TensorOptions stat{.dtype = compute_dtype(x.dtype()), .device = x.device()};
  LayerNormResult r{empty(x.shape(), {.dtype = x.dtype(), .device = x.device()}),
                    centered ? empty(stat_shape(x), stat) : Tensor(), empty(stat_shape(x), stat)};
  const auto c = [](const Tensor& t) { return t.defined() ? contiguous(t) : Tensor(); };
  device_kernel(x.device(), &DeviceOps::norm, op)(centered, r.y, r.mean, r.rstd, contiguous(x), c(weight), c(bias),
                                                  eps);
  profile::add_work(0, 2 * profile::tensor_bytes(x) + profile::tensor_bytes(r.mean) + profile::tensor_bytes(r.rstd));
  return r;
}

template <bool centered>
NormGrads device_backward(const char* op, const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                          const Tensor& mean, const Tensor& rstd) {
  const TensorOptions opts{.dtype = x.dtype(), .device = x.device()};
  NormGrads g{empty(x.shape(), opts), weight.defined() ? empty({x.size(-1)}, opts) : Tensor(),
              centered ? empty({x.size(-1)}, opts) : Tensor()};
  device_kernel(x.device(), &DeviceOps::norm_backward, op)(
      centered, g.dx, g.dweight, g.dbias, contiguous(grad_y), contiguous(x),
      weight.defined() ? contiguous(weight) : Tensor(), centered ? contiguous(mean) : Tensor(), contiguous(rstd));
  profile::add_work(0, profile::tensor_bytes(grad_y) + profile::tensor_bytes(x) + profile::tensor_bytes(g.dx));
  return g;
}

template <bool centered>
NormGrads norm_backward(const char* op, const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd) {
  if (!x.device().is_cpu()) return device_backward<centered>(op, grad_y, x, weight, mean, rstd);
  const DType compute = compute_dtype(x.dtype());
  const Tensor gc = prepare(grad_y, compute), xc = prepare(x, compute), wc = prepare(weight, compute);
  const Tensor mc = centered ? contiguous(mean) : Tensor(), rc = contiguous(rstd);
  Tensor dx = empty(x.shape(), {.dtype = compute});
  Tensor dw = weight.defined() ? empty({x.size(-1)}, {.dtype = compute}) : Tensor();
  Tensor db = centered ? empty({x.size(-1)}, {.dtype = compute}) : Tensor();
  const int64_t cols = x.size(-1);
  const int64_t rows = x.numel() / cols;
  visit_compute_dtype(compute, op, [&]<class T>() {
    backward_kernel<centered, T>(gc.data<T>(), xc.data<T>(), wc.defined() ? wc.data<T>() : nullptr,
                                 centered ? mc.data<T>() : nullptr, rc.data<T>(), dx.data<T>(),
                                 dw.defined() ? dw.data<T>() : nullptr, db.defined() ? db.data<T>() : nullptr, rows,
                                 cols);
  });
  const DType dtype = x.dtype();
  return {to(dx, dtype), dw.defined() ? to(dw, dtype) : Tensor(), db.defined() ? to(db, dtype) : Tensor()};
}

}  // namespace

LayerNormResult layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  const char* op = "layer_norm";
  check_x(x, op);
  check_param(weight, x, op, "weight");
  check_param(bias, x, op, "bias");
  check_eps(eps, op);
  if (!x.device().is_cpu()) return device_forward<true>(op, x, weight, bias, eps);
  const DType compute = compute_dtype(x.dtype());
  const Tensor xc = prepare(x, compute), wc = prepare(weight, compute), bc = prepare(bias, compute);
  Tensor y = empty(x.shape(), {.dtype = compute});
  Tensor mean = empty(stat_shape(x), {.dtype = compute});
  Tensor rstd = empty(stat_shape(x), {.dtype = compute});
  const int64_t cols = x.size(-1);
  visit_compute_dtype(compute, op, [&]<class T>() {
    forward_kernel<true, T>(xc.data<T>(), wc.defined() ? wc.data<T>() : nullptr, bc.defined() ? bc.data<T>() : nullptr,
                            y.data<T>(), mean.data<T>(), rstd.data<T>(), x.numel() / cols, cols, static_cast<T>(eps));
  });
  return {to(y, x.dtype()), mean, rstd};
}

NormGrads layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& mean,
                              const Tensor& rstd) {
  const char* op = "layer_norm_backward";
  check_x(x, op);
  check_grad(grad_y, x, op);
  check_param(weight, x, op, "weight");
  check_stat(mean, x, op, "mean");
  check_stat(rstd, x, op, "rstd");
  return norm_backward<true>(op, grad_y, x, weight, mean, rstd);
}

RmsNormResult rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  const char* op = "rms_norm";
  check_x(x, op);
  check_param(weight, x, op, "weight");
  check_eps(eps, op);
  if (!x.device().is_cpu()) {
    LayerNormResult r = device_forward<false>(op, x, weight, Tensor(), eps);
    return {r.y, r.rstd};
  }
  const DType compute = compute_dtype(x.dtype());
  const Tensor xc = prepare(x, compute), wc = prepare(weight, compute);
  Tensor y = empty(x.shape(), {.dtype = compute});
  Tensor rstd = empty(stat_shape(x), {.dtype = compute});
  const int64_t cols = x.size(-1);
  visit_compute_dtype(compute, op, [&]<class T>() {
    forward_kernel<false, T>(xc.data<T>(), wc.defined() ? wc.data<T>() : nullptr, nullptr, y.data<T>(), nullptr,
                             rstd.data<T>(), x.numel() / cols, cols, static_cast<T>(eps));
  });
  return {to(y, x.dtype()), rstd};
}

NormGrads rms_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& rstd) {
  const char* op = "rms_norm_backward";
  check_x(x, op);
  check_grad(grad_y, x, op);
  check_param(weight, x, op, "weight");
  check_stat(rstd, x, op, "rstd");
  return norm_backward<false>(op, grad_y, x, weight, Tensor(), rstd);
}

}  // namespace cpf::raw
