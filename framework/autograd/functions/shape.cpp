#include "framework/autograd/functions/shape.h"

#include "framework/autograd/node.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/reduce.h"
#include "framework/tensor/ops/views.h"
#include "framework/tensor/shape_utils.h"

namespace cpf {
namespace {

using autograd::GradList;

// Gradient of a view selecting part of x: zeros of x's shape with g written into the same view.
Tensor scatter_into_view(const Tensor& g, const Shape& shape, DType dtype,
                         const std::function<Tensor(const Tensor&)>& same_view) {
  Tensor full_grad = zeros(shape, {.dtype = dtype, .device = g.device()});
  raw::copy_(same_view(full_grad), g);
  return full_grad;
}

}  // namespace

Tensor view(const Tensor& x, const Shape& shape) {
  return autograd::record("view", raw::view(x, shape), {x},
                          [in = x.shape()](const GradList& g) { return GradList{raw::reshape(g[0], in)}; });
}

Tensor reshape(const Tensor& x, const Shape& shape) {
  return autograd::record("reshape", raw::reshape(x, shape), {x},
                          [in = x.shape()](const GradList& g) { return GradList{raw::reshape(g[0], in)}; });
}

Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  return autograd::record("flatten", raw::flatten(x, start_dim, end_dim), {x},
                          [in = x.shape()](const GradList& g) { return GradList{raw::reshape(g[0], in)}; });
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  Tensor y = raw::permute(x, dims);
  std::vector<int64_t> inverse(dims.size());
  for (size_t i = 0; i < dims.size(); ++i)
    inverse[normalize_dim(dims[i], x.dim(), "permute")] = static_cast<int64_t>(i);
  return autograd::record("permute", y, {x},
                          [inverse](const GradList& g) { return GradList{raw::permute(g[0], inverse)}; });
}

Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  return autograd::record("transpose", raw::transpose(x, dim0, dim1), {x},
                          [dim0, dim1](const GradList& g) { return GradList{raw::transpose(g[0], dim0, dim1)}; });
}

Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  return autograd::record("narrow", raw::narrow(x, dim, start, length), {x},
                          [shape = x.shape(), dtype = x.dtype(), dim, start, length](const GradList& g) {
                            return GradList{scatter_into_view(g[0], shape, dtype, [&](const Tensor& t) {
                              return raw::narrow(t, dim, start, length);
                            })};
                          });
}

Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  return autograd::record("slice", raw::slice(x, dim, start, end, step), {x},
                          [shape = x.shape(), dtype = x.dtype(), dim, start, end, step](const GradList& g) {
                            return GradList{scatter_into_view(g[0], shape, dtype, [&](const Tensor& t) {
                              return raw::slice(t, dim, start, end, step);
                            })};
                          });
}

Tensor select(const Tensor& x, int64_t dim, int64_t index) {
  return autograd::record(
      "select", raw::select(x, dim, index), {x}, [shape = x.shape(), dtype = x.dtype(), dim, index](const GradList& g) {
        return GradList{
            scatter_into_view(g[0], shape, dtype, [&](const Tensor& t) { return raw::select(t, dim, index); })};
      });
}

Tensor expand(const Tensor& x, const Shape& shape) {
  return autograd::record("expand", raw::expand(x, shape), {x},
                          [in = x.shape()](const GradList& g) { return GradList{raw::sum_to(g[0], in)}; });
}

Tensor squeeze(const Tensor& x, int64_t dim) {
  return autograd::record("squeeze", raw::squeeze(x, dim), {x},
                          [in = x.shape()](const GradList& g) { return GradList{raw::reshape(g[0], in)}; });
}

Tensor unsqueeze(const Tensor& x, int64_t dim) {
  return autograd::record("unsqueeze", raw::unsqueeze(x, dim), {x},
                          [in = x.shape()](const GradList& g) { return GradList{raw::reshape(g[0], in)}; });
}

Tensor contiguous(const Tensor& x) {
  if (x.is_contiguous()) return x;
  return autograd::record("contiguous", raw::contiguous(x), {x}, [](const GradList& g) { return GradList{g[0]}; });
}

Tensor clone(const Tensor& x) {
  return autograd::record("clone", raw::clone(x), {x}, [](const GradList& g) { return GradList{g[0]}; });
}

Tensor to(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  return autograd::record("to", raw::to(x, dtype), {x},
                          [from = x.dtype()](const GradList& g) { return GradList{raw::to(g[0], from)}; });
}

Tensor to(const Tensor& x, Device device) {
  if (x.device() == device) return x;
  return autograd::record("to", raw::to(x, device), {x},
                          [from = x.device()](const GradList& g) { return GradList{raw::to(g[0], from)}; });
}

}  // namespace cpf
