#include "framework/tensor/tensor.h"

#include "framework/tensor/ops/copy.h"
#include "framework/tensor/shape_utils.h"

namespace cpf {
namespace {

TensorImpl& checked(const std::shared_ptr<TensorImpl>& impl) {
  CPF_CHECK(impl != nullptr, "operation on an undefined tensor");
  return *impl;
}

}  // namespace

const Shape& Tensor::shape() const { return checked(impl_).shape; }
const Shape& Tensor::strides() const { return checked(impl_).strides; }
int64_t Tensor::offset() const { return checked(impl_).offset; }
int64_t Tensor::dim() const { return static_cast<int64_t>(shape().size()); }
// normalize_dim accepts 0 and -1 for rank 0 (ops like sum(x, {0}) allow it), but there is no size
// to read then.
int64_t Tensor::size(int64_t d) const {
  CPF_CHECK(dim() > 0, "size: a tensor of rank 0 has no dims (asked for dim ", d, ")");
  return shape()[normalize_dim(d, dim(), "size")];
}
int64_t Tensor::stride(int64_t d) const {
  CPF_CHECK(dim() > 0, "stride: a tensor of rank 0 has no dims (asked for dim ", d, ")");
  return strides()[normalize_dim(d, dim(), "stride")];
}
int64_t Tensor::numel() const { return shape_numel(shape()); }
DType Tensor::dtype() const { return checked(impl_).dtype; }
static Device device_of(const TensorImpl& impl) { return impl.storage ? impl.storage->device() : Device::cpu(); }
Device Tensor::device() const { return device_of(checked(impl_)); }
const std::shared_ptr<Storage>& Tensor::storage() const { return checked(impl_).storage; }

bool Tensor::is_contiguous() const {
  const auto& impl = checked(impl_);
  int64_t expected = 1;
  for (int64_t d = static_cast<int64_t>(impl.shape.size()) - 1; d >= 0; --d) {
    if (impl.shape[d] == 1) continue;
    if (impl.strides[d] != expected) return false;
    expected *= impl.shape[d];
  }
  return true;
}

void* Tensor::raw_data() const {
  const auto& impl = checked(impl_);
  if (!impl.storage || impl.storage->data() == nullptr) {
    // Only an empty tensor may have no memory. A parameter sharded with parallel.shard: parameters has none
    // outside its unit's acquire/release (framework/nn/parameter_units.h): reading it there is a bug.
    CPF_CHECK(shape_numel(impl.shape) == 0, "a tensor of shape ", impl.shape,
              " has no memory: its storage was released (a parameter sharded with parallel.shard: parameters, "
              "read outside the acquire/release of its unit, framework/nn/parameter_units.h)");
    return nullptr;
  }
  return static_cast<char*>(impl.storage->data()) + impl.offset * static_cast<int64_t>(dtype_size(impl.dtype));
}

uint64_t Tensor::version() const { return storage() ? storage()->version() : 0; }
void Tensor::bump_version() const {
  if (storage()) storage()->bump_version();
}

bool Tensor::requires_grad() const { return checked(impl_).requires_grad; }

Tensor& Tensor::set_requires_grad(bool requires_grad) {
  auto& impl = checked(impl_);
  CPF_CHECK(impl.grad_fn == nullptr || requires_grad, "set_requires_grad(false) on a non-leaf tensor of shape ",
            impl.shape, ": use detach() to take it out of the graph");
  CPF_CHECK(!requires_grad || is_floating(impl.dtype),
            "set_requires_grad: only floating tensors can require grad, got ", impl.dtype);
  impl.requires_grad = requires_grad;
  return *this;
}

Tensor Tensor::grad() const { return checked(impl_).grad; }
void Tensor::set_grad(const Tensor& grad) const {
  auto& impl = checked(impl_);
  if (grad.defined()) {
    CPF_CHECK(grad.shape() == impl.shape, "set_grad: gradient shape ", grad.shape(), " differs from tensor shape ",
              impl.shape);
  }
  impl.grad = grad;
}
const std::shared_ptr<autograd::Node>& Tensor::grad_fn() const { return checked(impl_).grad_fn; }
uint32_t Tensor::output_nr() const { return checked(impl_).output_nr; }

Tensor Tensor::detach() const {
  const auto& impl = checked(impl_);
  return make_tensor(impl.storage, impl.shape, impl.strides, impl.offset, impl.dtype);
}

template <class T>
T Tensor::item() const {
  CPF_CHECK(numel() == 1, "item() needs exactly one element, got shape ", shape());
  Tensor host = raw::to(raw::to(*this, Device::cpu()), dtype_v<T>);
  return *host.data<T>();
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  Tensor host = raw::contiguous(raw::to(raw::to(*this, Device::cpu()), dtype_v<T>));
  const T* begin = host.data<T>();
  return std::vector<T>(begin, begin + host.numel());
}

#define CPF_INSTANTIATE_ACCESSORS(T)  \
  template T Tensor::item<T>() const; \
  template std::vector<T> Tensor::to_vector<T>() const;
CPF_INSTANTIATE_ACCESSORS(float)
CPF_INSTANTIATE_ACCESSORS(double)
CPF_INSTANTIATE_ACCESSORS(bfloat16)
CPF_INSTANTIATE_ACCESSORS(int32_t)
CPF_INSTANTIATE_ACCESSORS(int64_t)
CPF_INSTANTIATE_ACCESSORS(bool)
#undef CPF_INSTANTIATE_ACCESSORS

}  // namespace cpf
