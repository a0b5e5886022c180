#include "framework/autograd/functions/reduce.h"

#include "framework/autograd/node.h"
#include "framework/tensor/ops/copy.h"

#include <limits>
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/reduce.h"
#include "framework/tensor/ops/views.h"
#include "framework/tensor/shape_utils.h"

namespace cpf {
namespace {

using autograd::GradList;
using autograd::SavedTensor;

// The reduced gradient reshaped so it broadcasts against the input (size-1 at reduced dims).
Tensor expand_back(const Tensor& grad, const Shape& input_shape, const std::vector<int64_t>& dims, bool keepdim) {
  const auto norm = normalize_dims(dims, static_cast<int64_t>(input_shape.size()), "reduce backward");
  const Shape kept = reduced_shape(input_shape, norm, true);
  Tensor g = keepdim ? grad : raw::reshape(grad, kept);
  return raw::expand(g, input_shape);
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return autograd::record("sum", raw::sum(x, dims, keepdim), {x},
                          [shape = x.shape(), dims, keepdim](const GradList& g) {
                            return GradList{raw::contiguous(expand_back(g[0], shape, dims, keepdim))};
                          });
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  const Tensor y = raw::mean(x, dims, keepdim);
  const double count = y.numel() == 0 ? 1.0 : static_cast<double>(x.numel()) / static_cast<double>(y.numel());
  return autograd::record("mean", y, {x}, [shape = x.shape(), dims, keepdim, count](const GradList& g) {
    return GradList{raw::mul(expand_back(g[0], shape, dims, keepdim), 1.0 / count)};
  });
}

Tensor amax(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  const Tensor y = raw::amax(x, dims, keepdim);
  return autograd::record("amax", y, {x}, [sx = SavedTensor(x), sy = SavedTensor(y), dims, keepdim](const GradList& g) {
    const Tensor& xv = sx.unpack();
    const Shape& shape = xv.shape();
    Tensor is_max =
        raw::to(raw::compare(raw::CompareOp::eq, xv, expand_back(sy.unpack(), shape, dims, keepdim)), xv.dtype());
    Tensor ties = raw::sum(is_max, dims, true);
    Tensor share = raw::div(is_max, ties);
    return GradList{raw::mul(share, expand_back(g[0], shape, dims, keepdim))};
  });
}

Tensor logsumexp(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  const Tensor y = raw::logsumexp(x, dims, keepdim);
  return autograd::record(
      "logsumexp", y, {x}, [sx = SavedTensor(x), sy = SavedTensor(y), dims, keepdim](const GradList& g) {
        const Tensor& xv = sx.unpack();
        const Shape& shape = xv.shape();
        // softmax(x) * g; rows whose lse is -inf contribute exp(-inf - -inf) = NaN,
        // so they are zeroed explicitly.
        Tensor lse = expand_back(sy.unpack(), shape, dims, keepdim);
        Tensor p = raw::exp(raw::sub(xv, lse));
        Tensor finite = raw::compare(raw::CompareOp::gt, lse, -std::numeric_limits<double>::infinity());
        p = raw::where(finite, p, zeros({}, {.dtype = p.dtype(), .device = p.device()}));
        return GradList{raw::mul(p, expand_back(g[0], shape, dims, keepdim))};
      });
}

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) { return raw::argmax(x, dim, keepdim); }

}  // namespace cpf
