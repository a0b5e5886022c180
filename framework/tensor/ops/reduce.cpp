#include "framework/tensor/ops/reduce.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>

#include "framework/tensor/device_ops.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/views.h"
#include "framework/tensor/shape_utils.h"

namespace cpf::raw {
namespace {

template <class T>
using RowMajorArray = Eigen::Array<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// x viewed as a contiguous (kept, reduced) matrix: kept dims first, reduced dims last.
struct ReductionLayout {
  Tensor rows;  // (K, R), contiguous
  Shape out_shape;
  int64_t kept = 1, reduced = 1;
};

ReductionLayout layout_for(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, const char* op) {
  check_defined(x, op, "x");
  CPF_CHECK(has_kernel(x.device(), &DeviceOps::reduce_rows), op, ": no kernel for device ", x.device(),
            " in this build");
  CPF_CHECK(is_floating(x.dtype()), op, ": needs a floating tensor, got ", x.dtype());
  const auto reduce_dims = normalize_dims(dims, x.dim(), op);
  std::vector<int64_t> order;
  ReductionLayout layout;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (std::find(reduce_dims.begin(), reduce_dims.end(), d) == reduce_dims.end()) {
      order.push_back(d);
      layout.kept *= x.size(d);
    }
  }
  for (int64_t d : reduce_dims) {
    if (d >= x.dim()) continue;  // dim 0 / -1 of a 0-d tensor: nothing to reduce
    order.push_back(d);
    layout.reduced *= x.size(d);
  }
  // The CPU folds bf16 in f32 arrays; device kernels read bf16 and accumulate in f32 themselves.
  Tensor src = x.dtype() == DType::bf16 && x.device().is_cpu() ? to(x, DType::f32) : x;
  layout.rows = contiguous(permute(src, order));
  layout.out_shape = reduced_shape(x.shape(), reduce_dims, keepdim);
  return layout;
}

// A device reduction of a contiguous x over its leading dims (a bias gradient: dY (T, C) summed over
// T) folded in place as (R, K) columns: no transposing copy of x. Undefined when that does not apply.
Tensor reduce_leading_dims_on_device(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, const char* op,
                                     DeviceReduceOp kind) {
  if (!x.defined() || x.device().is_cpu() || !x.is_contiguous() || x.numel() == 0 ||
      !has_kernel(x.device(), &DeviceOps::reduce_cols) ||
      (kind != DeviceReduceOp::sum && kind != DeviceReduceOp::mean && kind != DeviceReduceOp::amax) ||
      !is_floating(x.dtype())) {
    return {};
  }
  const std::vector<int64_t> reduce_dims = normalize_dims(dims, x.dim(), op);  // sorted
  const auto count = static_cast<int64_t>(reduce_dims.size());
  if (count == 0 || count >= x.dim()) return {};  // nothing kept: the row kernel reads it in place already
  for (int64_t i = 0; i < count; ++i) {
    if (reduce_dims[static_cast<size_t>(i)] != i) return {};  // not a leading prefix
  }
  int64_t reduced = 1;
  for (int64_t d = 0; d < count; ++d) reduced *= x.size(d);
  const int64_t kept = x.numel() / reduced;
  Tensor out = empty(reduced_shape(x.shape(), reduce_dims, keepdim), {.dtype = x.dtype(), .device = x.device()});
  device_kernel(x.device(), &DeviceOps::reduce_cols, op)(kind, view(out, {kept}), view(x, {reduced, kept}));
  return out;
}

// out[k] = fn(row k as an Eigen array) for each kept index k, in the compute dtype of x.
template <class Fn>
Tensor reduce_rows(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, const char* op, DeviceReduceOp kind,
                   Fn&& fn) {
  if (Tensor folded = reduce_leading_dims_on_device(x, dims, keepdim, op, kind); folded.defined()) return folded;
  ReductionLayout layout = layout_for(x, dims, keepdim, op);
  if (!x.device().is_cpu()) {
    Tensor out = empty(layout.out_shape, {.dtype = layout.rows.dtype(), .device = x.device()});
    const Tensor rows = view(layout.rows, {layout.kept, layout.reduced});  // (K, R)
    device_kernel(x.device(), &DeviceOps::reduce_rows, op)(kind, out, rows);
    return x.dtype() == DType::bf16 ? to(out, DType::bf16) : out;
  }
  Tensor out = empty(layout.out_shape, {.dtype = layout.rows.dtype()});
  visit_compute_dtype(layout.rows.dtype(), op, [&]<class T>() {
    Eigen::Map<const RowMajorArray<T>> in(layout.rows.data<T>(), layout.kept, layout.reduced);
    T* o = out.data<T>();
    const int64_t kept = layout.kept;
#if defined(CPF_WITH_OPENMP)
#pragma omp parallel for if (kept * layout.reduced > (1 << 16) && kept > 1) schedule(static)
#endif
    for (int64_t k = 0; k < kept; ++k) o[k] = fn(in.row(k));
  });
  return x.dtype() == DType::bf16 ? to(out, DType::bf16) : out;
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return reduce_rows(x, dims, keepdim, "sum", DeviceReduceOp::sum, [](const auto& row) { return row.sum(); });
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return reduce_rows(x, dims, keepdim, "mean", DeviceReduceOp::mean, [](const auto& row) {
    using T = typename std::decay_t<decltype(row)>::Scalar;
    return row.size() == 0 ? std::numeric_limits<T>::quiet_NaN() : row.sum() / static_cast<T>(row.size());
  });
}

Tensor amax(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  for (int64_t d : normalize_dims(dims, x.dim(), "amax")) {
    if (d >= x.dim()) continue;
    CPF_CHECK(x.size(d) > 0, "amax: cannot reduce over dim ", d, " of size 0 (shape ", x.shape(), ")");
  }
  // NaN propagates (Eigen's default maxCoeff may skip it).
  return reduce_rows(x, dims, keepdim, "amax", DeviceReduceOp::amax,
                     [](const auto& row) { return row.template maxCoeff<Eigen::PropagateNaN>(); });
}

Tensor logsumexp(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return reduce_rows(x, dims, keepdim, "logsumexp", DeviceReduceOp::logsumexp, [](const auto& row) {
    using T = typename std::decay_t<decltype(row)>::Scalar;
    if (row.size() == 0) return -std::numeric_limits<T>::infinity();
    const T m = row.maxCoeff();
    if (!std::isfinite(m)) return m;  // all -inf stays -inf; +inf/NaN propagate
    return m + std::log((row - m).exp().sum());
  });
}

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  const int64_t d = normalize_dim(dim, x.dim(), "argmax");
  CPF_CHECK(x.dim() == 0 || x.size(d) > 0, "argmax: dim ", d, " has size 0 (shape ", x.shape(), ")");
  ReductionLayout layout = layout_for(x, {d}, keepdim, "argmax");
  if (!x.device().is_cpu()) {
    Tensor out = empty(layout.out_shape, {.dtype = DType::i64, .device = x.device()});
    device_kernel(x.device(), &DeviceOps::reduce_rows, "argmax")(DeviceReduceOp::argmax, out,
                                                                 view(layout.rows, {layout.kept, layout.reduced}));
    return out;
  }
  Tensor out = empty(layout.out_shape, {.dtype = DType::i64});
  visit_compute_dtype(layout.rows.dtype(), "argmax", [&]<class T>() {
    Eigen::Map<const RowMajorArray<T>> in(layout.rows.data<T>(), layout.kept, layout.reduced);
    int64_t* o = out.data<int64_t>();
    for (int64_t k = 0; k < layout.kept; ++k) {
      Eigen::Index best = 0;
      in.row(k).maxCoeff(&best);
      o[k] = static_cast<int64_t>(best);
    }
  });
  return out;
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  CPF_CHECK(broadcast_shapes(shape, x.shape(), "sum_to") == x.shape(), "sum_to: ", x.shape(), " is not a broadcast of ",
            shape);
  const int64_t lead = x.dim() - static_cast<int64_t>(shape.size());
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (d < lead || (shape[d - lead] == 1 && x.size(d) != 1)) dims.push_back(d);
  }
  if (dims.empty()) return reshape(x, shape);
  return reshape(sum(x, dims, true), shape);
}

}  // namespace cpf::raw
