#include "framework/autograd/functions/join.h"

#include "framework/autograd/node.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/join.h"
#include "framework/tensor/ops/views.h"
#include "framework/tensor/shape_utils.h"

namespace cpf {
namespace {

using autograd::GradList;

// The pieces' gradients as one contiguous view when they already lie side by side, in order, in one
// storage (cuDNN attention writes dq/dk/dv into one packed buffer, so the split of the fused q/k/v
// projection joins them without a copy); undefined otherwise. Contiguous only: a joined gradient never
// overlaps itself, so a leaf may adopt it and accumulate into it.
Tensor adjacent_view(const GradList& g, const Shape& shape, DType dtype, const Device& device, int64_t d,
                     const std::vector<int64_t>& sizes) {
  if (g.size() != sizes.size() || g.empty()) return {};
  const Tensor& first = g[0];
  int64_t start = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const Tensor& p = g[i];
    if (!p.defined() || sizes[i] <= 0 || p.dtype() != dtype || p.device() != device) return {};
    if (p.storage() != first.storage() || p.strides() != first.strides()) return {};
    if (p.offset() != first.offset() + start * first.stride(d)) return {};
    start += sizes[i];
  }
  const Tensor joined = raw::as_strided(first, shape, first.strides(), first.offset());
  return joined.is_contiguous() ? joined : Tensor();
}

// The gradient of x from the gradients of pieces cut out of it along d (undefined ones count as zero).
Tensor join_piece_grads(const GradList& g, const Shape& shape, DType dtype, Device device, int64_t d,
                        const std::vector<int64_t>& sizes) {
  if (Tensor joined = adjacent_view(g, shape, dtype, device, d, sizes); joined.defined()) return joined;
  Tensor grad = zeros(shape, {.dtype = dtype, .device = device});
  int64_t start = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (g[i].defined() && sizes[i] > 0) raw::copy_(raw::narrow(grad, d, start, sizes[i]), g[i]);
    start += sizes[i];
  }
  return grad;
}

}  // namespace

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  Tensor out = raw::cat(tensors, dim);  // validates, so the dim below is in range
  const int64_t d = normalize_dim(dim, out.dim(), "cat");
  std::vector<int64_t> sizes;
  for (const Tensor& t : tensors) sizes.push_back(t.size(d));
  return autograd::record("cat", out, tensors, [d, sizes](const GradList& g) {
    GradList grads(sizes.size());
    if (!g[0].defined()) return grads;
    int64_t start = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      grads[i] = raw::narrow(g[0], d, start, sizes[i]);
      start += sizes[i];
    }
    return grads;
  });
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  Tensor out = raw::stack(tensors, dim);
  const int64_t d = normalize_dim(dim, out.dim(), "stack");
  const size_t count = tensors.size();
  return autograd::record("stack", out, tensors, [d, count](const GradList& g) {
    GradList grads(count);
    if (!g[0].defined()) return grads;
    for (size_t i = 0; i < count; ++i) grads[i] = raw::select(g[0], d, static_cast<int64_t>(i));
    return grads;
  });
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  std::vector<Tensor> pieces = raw::split(x, sizes, dim);
  const int64_t d = normalize_dim(dim, x.dim(), "split");
  return autograd::record("split", pieces, {x},
                          [shape = x.shape(), dtype = x.dtype(), device = x.device(), d, sizes](const GradList& g) {
                            return GradList{join_piece_grads(g, shape, dtype, device, d, sizes)};
                          });
}

std::vector<Tensor> split(const Tensor& x, int64_t chunk_size, int64_t dim) {
  std::vector<Tensor> pieces = raw::split(x, chunk_size, dim);
  const int64_t d = normalize_dim(dim, x.dim(), "split");
  std::vector<int64_t> sizes;
  for (const Tensor& p : pieces) sizes.push_back(p.size(d));
  return autograd::record("split", pieces, {x},
                          [shape = x.shape(), dtype = x.dtype(), device = x.device(), d, sizes](const GradList& g) {
                            return GradList{join_piece_grads(g, shape, dtype, device, d, sizes)};
                          });
}

}  // namespace cpf
