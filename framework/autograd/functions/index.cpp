#include "framework/autograd/functions/index.h"

#include "framework/autograd/node.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/index.h"
#include "framework/tensor/ops/reduce.h"
#include "framework/tensor/shape_utils.h"

namespace cpf {
namespace {

using autograd::GradList;
using autograd::SavedTensor;

}  // namespace

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  Tensor out = raw::index_select(x, dim, index);
  const int64_t d = normalize_dim(dim, x.dim(), "index_select");
  return autograd::record("index_select", out, {x}, [shape = x.shape(), d, si = SavedTensor(index)](const GradList& g) {
    Tensor grad = zeros(shape, {.dtype = g[0].dtype(), .device = g[0].device()});
    raw::index_add_(grad, d, si.unpack(), g[0]);
    return GradList{grad};
  });
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  Tensor out = raw::gather(x, dim, index);
  const int64_t d = normalize_dim(dim, x.dim(), "gather");
  return autograd::record("gather", out, {x}, [shape = x.shape(), d, si = SavedTensor(index)](const GradList& g) {
    Tensor grad = zeros(shape, {.dtype = g[0].dtype(), .device = g[0].device()});
    raw::scatter_add_(grad, d, si.unpack(), g[0]);
    return GradList{grad};
  });
}

Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  Tensor out = raw::scatter_add(x, dim, index, src);
  const int64_t d = normalize_dim(dim, x.dim(), "scatter_add");
  return autograd::record("scatter_add", out, {x, src}, [d, si = SavedTensor(index)](const GradList& g) {
    return GradList{g[0], raw::gather(g[0], d, si.unpack())};
  });
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  Tensor out = raw::where(cond, a, b);
  return autograd::record(
      "where", out, {a, b}, [sc = SavedTensor(cond), as = a.shape(), bs = b.shape()](const GradList& g) {
        const Tensor& c = sc.unpack();
        Tensor zero = zeros({}, {.dtype = g[0].dtype(), .device = g[0].device()});
        return GradList{raw::sum_to(raw::where(c, g[0], zero), as), raw::sum_to(raw::where(c, zero, g[0]), bs)};
      });
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  Tensor out = raw::masked_fill(x, mask, value);
  return autograd::record("masked_fill", out, {x}, [sm = SavedTensor(mask)](const GradList& g) {
    return GradList{raw::masked_fill(g[0], sm.unpack(), 0.0)};
  });
}

}  // namespace cpf
