#include "framework/tensor/ops/views.h"

#include <algorithm>
#include <optional>

#include "framework/tensor/ops/copy.h"
#include "framework/tensor/shape_utils.h"

namespace cpf::raw {
namespace {

Tensor make_view(const Tensor& t, Shape shape, Shape strides, int64_t offset) {
  return make_tensor(t.storage(), std::move(shape), std::move(strides), offset, t.dtype());
}

// Strides for viewing `t` as `shape` without copying, or empty when impossible. Works group by
// group: a run of old dims that is contiguous in memory can be re-split any way.
std::optional<Shape> view_strides(const Tensor& t, const Shape& shape) {
  const Shape& old_shape = t.shape();
  const Shape& old_strides = t.strides();
  Shape strides(shape.size(), 1);
  if (t.numel() == 0 || old_shape.empty()) return contiguous_strides(shape);
  int64_t view_d = static_cast<int64_t>(shape.size()) - 1;
  int64_t chunk_base_stride = old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(old_shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= old_shape[d];
    const bool chunk_ends = d == 0 || (old_shape[d - 1] != 1 && old_strides[d - 1] != tensor_numel * chunk_base_stride);
    if (chunk_ends) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        strides[view_d] = view_numel * chunk_base_stride;
        view_numel *= shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk_base_stride = old_strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return strides;
}

}  // namespace

Shape infer_shape(const Shape& shape, int64_t numel, const char* op) {
  Shape out = shape;
  int64_t known = 1;
  int64_t infer_at = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      CPF_CHECK(infer_at < 0, op, ": only one dimension can be -1, got ", shape);
      infer_at = static_cast<int64_t>(i);
    } else {
      CPF_CHECK(out[i] >= 0, op, ": invalid dimension ", out[i], " in shape ", shape);
      known *= out[i];
    }
  }
  if (infer_at >= 0) {
    CPF_CHECK(known != 0, op, ": the -1 in shape ", shape, " is ambiguous: the other dims multiply to 0");
    CPF_CHECK(numel % known == 0, op, ": shape ", shape, " is invalid for ", numel, " elements");
    out[infer_at] = numel / known;
  }
  CPF_CHECK(shape_numel(out) == numel, op, ": shape ", shape, " is invalid for input of ", numel, " elements");
  return out;
}

Tensor as_strided(const Tensor& t, const Shape& shape, const Shape& strides, int64_t offset) {
  CPF_CHECK(shape.size() == strides.size(), "as_strided: shape ", shape, " and strides ", strides, " differ in rank");
  int64_t max_index = offset;
  for (size_t d = 0; d < shape.size(); ++d) {
    CPF_CHECK(shape[d] >= 0 && strides[d] >= 0, "as_strided: negative size or stride: shape ", shape, " strides ",
              strides);
    if (shape[d] == 0) max_index = offset - 1;
    if (max_index >= offset) max_index += (shape[d] - 1) * strides[d];
  }
  const int64_t capacity = static_cast<int64_t>(t.storage() ? t.storage()->nbytes() / dtype_size(t.dtype()) : 0);
  CPF_CHECK(offset >= 0 && max_index < capacity, "as_strided: view shape ", shape, " strides ", strides, " offset ",
            offset, " reaches element ", max_index, " beyond a storage of ", capacity, " elements");
  return make_view(t, shape, strides, offset);
}

Tensor view(const Tensor& t, Shape shape) {
  shape = infer_shape(shape, t.numel(), "view");
  auto strides = view_strides(t, shape);
  CPF_CHECK(strides.has_value(), "view: cannot view a tensor of shape ", t.shape(), " and strides ", t.strides(),
            " as ", shape, " without copying (use reshape)");
  return make_view(t, shape, *strides, t.offset());
}

Tensor reshape(const Tensor& t, Shape shape) {
  shape = infer_shape(shape, t.numel(), "reshape");
  if (auto strides = view_strides(t, shape)) return make_view(t, shape, *strides, t.offset());
  return view(clone(t), shape);
}

Tensor flatten(const Tensor& t, int64_t start_dim, int64_t end_dim) {
  if (t.dim() == 0) return reshape(t, {1});
  const int64_t s = normalize_dim(start_dim, t.dim(), "flatten");
  const int64_t e = normalize_dim(end_dim, t.dim(), "flatten");
  CPF_CHECK(s <= e, "flatten: start_dim ", start_dim, " comes after end_dim ", end_dim);
  Shape shape(t.shape().begin(), t.shape().begin() + s);
  int64_t merged = 1;
  for (int64_t d = s; d <= e; ++d) merged *= t.size(d);
  shape.push_back(merged);
  shape.insert(shape.end(), t.shape().begin() + e + 1, t.shape().end());
  return reshape(t, shape);
}

Tensor permute(const Tensor& t, const std::vector<int64_t>& dims) {
  CPF_CHECK(static_cast<int64_t>(dims.size()) == t.dim(), "permute: ", dims.size(), " dims given for a tensor of rank ",
            t.dim(), " (dims=", dims, ")");
  Shape shape(dims.size()), strides(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = normalize_dim(dims[i], t.dim(), "permute");
    CPF_CHECK(!seen[d], "permute: dim ", d, " repeated in ", dims);
    seen[d] = true;
    shape[i] = t.shape()[d];
    strides[i] = t.strides()[d];
  }
  return make_view(t, shape, strides, t.offset());
}

Tensor transpose(const Tensor& t, int64_t dim0, int64_t dim1) {
  const int64_t a = normalize_dim(dim0, t.dim(), "transpose");
  const int64_t b = normalize_dim(dim1, t.dim(), "transpose");
  if (t.dim() == 0) return permute(t, {});  // dims 0 and -1 both name "no dim" of a scalar
  std::vector<int64_t> dims(t.dim());
  for (int64_t i = 0; i < t.dim(); ++i) dims[i] = i;
  std::swap(dims[a], dims[b]);
  return permute(t, dims);
}

Tensor narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length) {
  const int64_t d = normalize_dim(dim, t.dim(), "narrow");
  CPF_CHECK(start >= 0 && length >= 0 && start + length <= t.size(d), "narrow: range [", start, ", ", start + length,
            ") out of bounds for dim ", d, " of size ", t.size(d), " (shape ", t.shape(), ")");
  Shape shape = t.shape();
  shape[d] = length;
  return make_view(t, shape, t.strides(), t.offset() + start * t.strides()[d]);
}

Tensor slice(const Tensor& t, int64_t dim, int64_t start, int64_t end, int64_t step) {
  const int64_t d = normalize_dim(dim, t.dim(), "slice");
  CPF_CHECK(step > 0, "slice: step must be positive, got ", step);
  const int64_t n = t.size(d);
  auto clamp = [n](int64_t i) { return std::clamp<int64_t>(i < 0 ? i + n : i, 0, n); };
  const int64_t s = clamp(start), e = std::max(clamp(end), clamp(start));
  Shape shape = t.shape(), strides = t.strides();
  shape[d] = (e - s + step - 1) / step;
  strides[d] *= step;
  return make_view(t, shape, strides, t.offset() + s * t.strides()[d]);
}

Tensor select(const Tensor& t, int64_t dim, int64_t index) {
  const int64_t d = normalize_dim(dim, t.dim(), "select");
  const int64_t n = t.size(d);
  CPF_CHECK(index >= -n && index < n, "select: index ", index, " out of range for dim ", d, " of size ", n);
  const int64_t i = index < 0 ? index + n : index;
  Shape shape = t.shape(), strides = t.strides();
  const int64_t offset = t.offset() + i * strides[d];
  shape.erase(shape.begin() + d);
  strides.erase(strides.begin() + d);
  return make_view(t, shape, strides, offset);
}

Tensor expand(const Tensor& t, const Shape& shape) {
  CPF_CHECK(shape.size() >= static_cast<size_t>(t.dim()), "expand: cannot expand shape ", t.shape(), " to fewer dims ",
            shape);
  const size_t lead = shape.size() - t.shape().size();
  Shape out_shape(shape.size()), strides(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i < lead) {
      CPF_CHECK(shape[i] >= 0, "expand: new leading dimension ", shape[i], " must be non-negative in ", shape);
      out_shape[i] = shape[i];
      strides[i] = 0;
      continue;
    }
    const int64_t old = t.shape()[i - lead];
    const int64_t want = shape[i] == -1 ? old : shape[i];
    CPF_CHECK(want >= 0, "expand: invalid size ", shape[i], " at dim ", i, " of ", shape);
    CPF_CHECK(old == want || old == 1, "expand: shape ", t.shape(), " cannot be expanded to ", shape, " (dim ", i, ": ",
              old, " -> ", want, ")");
    out_shape[i] = want;
    strides[i] = old == want ? t.strides()[i - lead] : 0;
  }
  return make_view(t, out_shape, strides, t.offset());
}

Tensor squeeze(const Tensor& t, int64_t dim) {
  const int64_t d = normalize_dim(dim, t.dim(), "squeeze");
  if (t.dim() == 0) return make_view(t, {}, {}, t.offset());
  CPF_CHECK(t.size(d) == 1, "squeeze: dim ", d, " has size ", t.size(d), ", not 1 (shape ", t.shape(), ")");
  return select(t, d, 0);
}

Tensor squeeze(const Tensor& t) {
  Shape shape, strides;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) == 1) continue;
    shape.push_back(t.size(d));
    strides.push_back(t.stride(d));
  }
  return make_view(t, shape, strides, t.offset());
}

Tensor unsqueeze(const Tensor& t, int64_t dim) {
  const int64_t d = normalize_dim(dim, t.dim() + 1, "unsqueeze");
  Shape shape = t.shape(), strides = t.strides();
  const int64_t stride = d < t.dim() ? t.strides()[d] * t.shape()[d] : 1;
  shape.insert(shape.begin() + d, 1);
  strides.insert(strides.begin() + d, stride);
  return make_view(t, shape, strides, t.offset());
}

}  // namespace cpf::raw
