#include "framework/tensor/shape_utils.h"

#include <algorithm>

namespace cpf {

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t running = 1;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    strides[d] = running;
    running *= std::max<int64_t>(shape[d], 1);
  }
  return strides;
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

int64_t normalize_dim(int64_t dim, int64_t ndim, const char* op) {
  const int64_t lo = ndim > 0 ? -ndim : -1;
  const int64_t hi = ndim > 0 ? ndim - 1 : 0;
  CPF_CHECK(dim >= lo && dim <= hi, op, ": dim ", dim, " out of range for a tensor of rank ", ndim, " (expected ", lo,
            "..", hi, ")");
  return dim < 0 ? dim + std::max<int64_t>(ndim, 1) : dim;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    CPF_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", a, " and ", b, " are not broadcastable (dim ", i, ": ",
              da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

std::vector<int64_t> normalize_dims(const std::vector<int64_t>& dims, int64_t ndim, const char* op) {
  std::vector<int64_t> out;
  if (dims.empty()) {
    for (int64_t d = 0; d < ndim; ++d) out.push_back(d);
    return out;
  }
  for (int64_t d : dims) out.push_back(normalize_dim(d, ndim, op));
  std::sort(out.begin(), out.end());
  CPF_CHECK(std::adjacent_find(out.begin(), out.end()) == out.end(), op, ": dims ", dims, " repeat a dimension");
  return out;
}

Shape reduced_shape(const Shape& shape, const std::vector<int64_t>& dims, bool keepdim) {
  Shape out;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    const bool reduced = std::find(dims.begin(), dims.end(), d) != dims.end();
    if (!reduced) {
      out.push_back(shape[d]);
    } else if (keepdim) {
      out.push_back(1);
    }
  }
  return out;
}

void check_defined(const Tensor& t, const char* op, const char* name) {
  CPF_CHECK(t.defined(), op, ": argument '", name, "' is an undefined tensor");
}

void check_same_dtype(const Tensor& a, const Tensor& b, const char* op) {
  CPF_CHECK(a.dtype() == b.dtype(), op, ": dtypes differ: ", a.dtype(), " ", a.shape(), " vs ", b.dtype(), " ",
            b.shape(), " (convert one with to(dtype))");
}

void check_same_device(const Tensor& a, const Tensor& b, const char* op) {
  CPF_CHECK(a.device() == b.device(), op, ": tensors are on different devices: ", a.device(), " vs ", b.device(), " (",
            a.dtype(), " ", a.shape(), " vs ", b.dtype(), " ", b.shape(), "); move one with to(device)");
}

}  // namespace cpf
