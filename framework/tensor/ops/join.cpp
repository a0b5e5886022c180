#include "framework/tensor/ops/join.h"

#include <algorithm>
#include <numeric>

#include "framework/tensor/device_ops.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/views.h"
#include "framework/tensor/shape_utils.h"

namespace cpf::raw {
namespace {

// Checks shared by cat and stack: a non-empty list of defined tensors of one dtype on one CPU device.
void check_join_inputs(const std::vector<Tensor>& tensors, const char* op) {
  CPF_CHECK(!tensors.empty(), op, ": expected at least one tensor, got an empty list");
  for (size_t i = 0; i < tensors.size(); ++i) {
    CPF_CHECK(tensors[i].defined(), op, ": tensor ", i, " is undefined");
  }
  const Tensor& first = tensors.front();
  for (size_t i = 1; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    CPF_CHECK(t.dtype() == first.dtype(), op, ": tensor ", i, " has dtype ", t.dtype(), " but tensor 0 has dtype ",
              first.dtype(), " (all tensors must share a dtype; convert with to(dtype))");
    CPF_CHECK(t.device() == first.device(), op, ": tensor ", i, " is on ", t.device(), " but tensor 0 is on ",
              first.device());
  }
  // The copies below write through strided views: the device's copy kernel takes any strides.
  CPF_CHECK(has_kernel(first.device(), &DeviceOps::copy), op, ": no kernel for device ", first.device(),
            " in this build");
}

}  // namespace

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  check_join_inputs(tensors, "cat");
  const Tensor& first = tensors.front();
  for (size_t i = 0; i < tensors.size(); ++i) {
    CPF_CHECK(tensors[i].dim() > 0, "cat: tensor ", i,
              " is zero-dimensional; cat joins along an existing dim (use stack to join scalars)");
  }
  const int64_t d = normalize_dim(dim, first.dim(), "cat");
  Shape out_shape = first.shape();
  out_shape[d] = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Shape& s = tensors[i].shape();
    CPF_CHECK(tensors[i].dim() == first.dim(), "cat: tensor ", i, " of shape ", s, " has rank ", tensors[i].dim(),
              " but tensor 0 of shape ", first.shape(), " has rank ", first.dim());
    for (int64_t k = 0; k < first.dim(); ++k) {
      CPF_CHECK(k == d || s[k] == first.shape()[k], "cat: tensor ", i, " of shape ", s, " does not match tensor 0 of ",
                "shape ", first.shape(), " outside dim ", d, " (sizes differ at dim ", k, ")");
    }
    out_shape[d] += s[d];
  }
  Tensor out = empty(out_shape, {.dtype = first.dtype(), .device = first.device()});
  int64_t start = 0;
  for (const Tensor& t : tensors) {
    const int64_t n = t.size(d);
    if (n > 0) copy_(narrow(out, d, start, n), t);
    start += n;
  }
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  check_join_inputs(tensors, "stack");
  const Tensor& first = tensors.front();
  for (size_t i = 1; i < tensors.size(); ++i) {
    CPF_CHECK(tensors[i].shape() == first.shape(), "stack: tensor ", i, " of shape ", tensors[i].shape(),
              " differs from tensor 0 of shape ", first.shape(), " (stack needs equal shapes)");
  }
  const int64_t d = normalize_dim(dim, first.dim() + 1, "stack");
  Shape out_shape = first.shape();
  out_shape.insert(out_shape.begin() + d, static_cast<int64_t>(tensors.size()));
  Tensor out = empty(out_shape, {.dtype = first.dtype(), .device = first.device()});
  for (size_t i = 0; i < tensors.size(); ++i) copy_(select(out, d, static_cast<int64_t>(i)), tensors[i]);
  return out;
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  check_defined(x, "split", "x");
  CPF_CHECK(x.dim() > 0, "split: cannot split a zero-dimensional tensor");
  const int64_t d = normalize_dim(dim, x.dim(), "split");
  for (int64_t s : sizes) CPF_CHECK(s >= 0, "split: sizes ", sizes, " contain a negative size");
  const int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  CPF_CHECK(total == x.size(d), "split: sizes ", sizes, " add up to ", total, " but dim ", d, " has size ", x.size(d),
            " (shape ", x.shape(), ")");
  std::vector<Tensor> pieces;
  pieces.reserve(sizes.size());
  int64_t start = 0;
  for (int64_t s : sizes) {
    pieces.push_back(narrow(x, d, start, s));
    start += s;
  }
  return pieces;
}

std::vector<Tensor> split(const Tensor& x, int64_t chunk_size, int64_t dim) {
  check_defined(x, "split", "x");
  CPF_CHECK(x.dim() > 0, "split: cannot split a zero-dimensional tensor");
  const int64_t d = normalize_dim(dim, x.dim(), "split");
  CPF_CHECK(chunk_size > 0, "split: chunk_size must be positive, got ", chunk_size);
  const int64_t n = x.size(d);
  std::vector<int64_t> sizes;
  for (int64_t start = 0; start < n; start += chunk_size) sizes.push_back(std::min(chunk_size, n - start));
  if (sizes.empty()) sizes.push_back(0);
  return split(x, sizes, d);
}

}  // namespace cpf::raw
