#pragma once
// Tensor: a value handle (shared_ptr) over TensorImpl = storage + shape/strides/offset view + dtype +
// autograd metadata. Copying a Tensor copies the handle, not the data.
//
// This layer knows nothing of differentiation beyond holding the metadata: view and compute functions
// here (namespace cpf::raw) never record graph nodes. The differentiable API lives in
// framework/autograd (namespace cpf: cpf::matmul, cpf::reshape, operators), which is what models use.
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "framework/core/error.h"
#include "framework/tensor/device.h"
#include "framework/tensor/dtype.h"
#include "framework/tensor/storage.h"

namespace cpf {

using Shape = std::vector<int64_t>;
namespace autograd {
class Node;
}

struct TensorImpl;

class Tensor {
 public:
  Tensor() = default;  // an undefined tensor (defined() == false)
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const noexcept { return impl_ != nullptr; }
  TensorImpl* impl() const noexcept { return impl_.get(); }
  bool is_same(const Tensor& other) const noexcept { return impl_ == other.impl_; }

  // ---- geometry ----
  const Shape& shape() const;
  const Shape& strides() const;  // in elements
  int64_t offset() const;        // in elements, into the storage
  int64_t dim() const;
  int64_t size(int64_t dim) const;  // negative dims count from the end
  int64_t stride(int64_t dim) const;
  int64_t numel() const;
  bool is_contiguous() const;
  DType dtype() const;
  Device device() const;
  const std::shared_ptr<Storage>& storage() const;

  // ---- data (host pointers require a cpu tensor) ----
  void* raw_data() const;  // first element of this view, in bytes
  template <class T>
  T* data() const {
    CPF_CHECK(dtype() == dtype_v<T>, "data<", dtype_name(dtype_v<T>), ">() on a ", dtype(), " tensor");
    return static_cast<T*>(raw_data());
  }
  // The single element as T (converted); copies from the device when needed.
  template <class T>
  T item() const;
  // All elements in row-major order, converted to T, on the host.
  template <class T>
  std::vector<T> to_vector() const;

  // ---- in-place tracking ----
  uint64_t version() const;
  void bump_version() const;  // call after writing into the storage

  // ---- autograd metadata (the engine lives in framework/autograd) ----
  bool requires_grad() const;
  // Marks a leaf as a parameter/input to differentiate; an error on non-leaves.
  Tensor& set_requires_grad(bool requires_grad = true);
  Tensor grad() const;  // undefined until a backward reaches this leaf
  void set_grad(const Tensor& grad) const;
  const std::shared_ptr<autograd::Node>& grad_fn() const;
  uint32_t output_nr() const;
  bool is_leaf() const { return grad_fn() == nullptr; }
  // Shares storage, drops the graph: the result is a leaf that does not require grad.
  Tensor detach() const;

  std::string str() const;  // readable printing, truncated for large tensors

 private:
  std::shared_ptr<TensorImpl> impl_;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Shape strides;
  int64_t offset = 0;
  DType dtype = DType::f32;

  // autograd
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<autograd::Node> grad_fn;
  uint32_t output_nr = 0;
  std::weak_ptr<autograd::Node> grad_accumulator;  // cached AccumulateGrad node of a leaf
};

std::ostream& operator<<(std::ostream& os, const Tensor& tensor);

// ---- construction ----
struct TensorOptions {
  DType dtype = DType::f32;
  Device device = Device::cpu();
  bool requires_grad = false;
};

Shape contiguous_strides(const Shape& shape);
int64_t shape_numel(const Shape& shape);

// A new tensor over fresh storage (uninitialised), or over existing storage with a given view.
Tensor make_tensor(std::shared_ptr<Storage> storage, Shape shape, Shape strides, int64_t offset, DType dtype);
Tensor empty(const Shape& shape, TensorOptions options = {});
Tensor zeros(const Shape& shape, TensorOptions options = {});
Tensor ones(const Shape& shape, TensorOptions options = {});
Tensor full(const Shape& shape, double value, TensorOptions options = {});
Tensor scalar_tensor(double value, TensorOptions options = {});  // shape []
// [start, end) with step; dtype defaults to i64 when options.dtype is integral, else as given.
Tensor arange(double start, double end, double step = 1.0, TensorOptions options = {.dtype = DType::i64});
Tensor arange(int64_t end, TensorOptions options = {.dtype = DType::i64});
// Copies `shape_numel(shape)` elements of `dtype` from host memory.
Tensor from_buffer(const void* host_data, const Shape& shape, DType dtype, Device device = Device::cpu());
template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, Device device = Device::cpu()) {
  CPF_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "from_vector: ", values.size(),
            " values do not fill shape ", shape);
  if constexpr (std::is_same_v<T, bool>) {
    // std::vector<bool> is bit-packed and has no data(): unpack to one bool per element first.
    std::unique_ptr<bool[]> unpacked(new bool[values.size()]);
    for (size_t i = 0; i < values.size(); ++i) unpacked[i] = values[i];
    return from_buffer(unpacked.get(), shape, DType::boolean, device);
  } else {
    return from_buffer(values.data(), shape, dtype_v<T>, device);
  }
}
Tensor empty_like(const Tensor& t);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor full_like(const Tensor& t, double value);

}  // namespace cpf
