#pragma once
// Device dispatch for the raw ops: a table of kernel entry points per device type, filled in by the
// library that implements the device (framework/tensor/cuda fills the cuda table when it registers).
//
// A raw op validates its inputs exactly as on the CPU, allocates its output on the inputs' device,
// then calls the entry for that device. An absent table or entry is reported as
//   "<op>: no kernel for device cuda:0 in this build"
// so a CPU-only build, or a device library that lacks a kernel, fails with one message everywhere.
//
// Contract of every entry: inputs are on one device (checked by the caller) and already validated;
// outputs are allocated by the caller with the documented shape and dtype; kernels run on the calling
// thread's current stream of that device and do not synchronise with the host unless stated.
#include <cstdint>
#include <vector>

#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/tensor.h"

namespace cpf {

enum class DeviceReduceOp { sum, mean, amax, logsumexp, argmax };
enum class DeviceSoftmaxOp { softmax, log_softmax, softmax_backward, log_softmax_backward };

struct DeviceOps {
  // dst (any strides, no self-overlap) = src broadcast to dst's shape, converted to dst's dtype.
  void (*copy)(const Tensor& dst, const Tensor& src) = nullptr;
  // Every element of dst (any strides) = value converted to dst's dtype (bf16 rounds from f32).
  void (*fill)(const Tensor& dst, double value) = nullptr;

  // out (contiguous, x's shape and dtype) = op(x); bf16 computes in f32.
  void (*unary)(raw::UnaryOp op, const Tensor& out, const Tensor& x) = nullptr;
  // out (contiguous, x's shape and dtype) = grad * op'(x) (y = op(x)); grad, x, y share shape and dtype.
  void (*unary_backward)(raw::UnaryOp op, const Tensor& out, const Tensor& grad, const Tensor& x,
                         const Tensor& y) = nullptr;
  // out (contiguous, broadcast shape, a's dtype) = a op b. Integer division by zero throws the CPU's
  // message (this entry synchronises with the host for integer div only).
  void (*binary)(raw::BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b) = nullptr;
  // out (contiguous, broadcast shape, bool) = a op b; a and b share a dtype.
  void (*compare)(raw::CompareOp op, const Tensor& out, const Tensor& a, const Tensor& b) = nullptr;
  // out (contiguous, broadcast shape, a's dtype) = cond ? a : b.
  void (*where)(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) = nullptr;
  // dst += alpha * src (src broadcast to dst; alpha whole for integer dst), in place.
  void (*add_)(const Tensor& dst, const Tensor& src, double alpha) = nullptr;
  // dst *= value in place, computed as the CPU does (double product, f32 for bf16).
  void (*mul_)(const Tensor& dst, double value) = nullptr;

  // rows (K, R) contiguous floating -> out (K) contiguous: rows' dtype, i64 for argmax. R may be 0
  // (sum 0, mean NaN, logsumexp -inf); the caller rejects amax/argmax over an empty dim.
  void (*reduce_rows)(DeviceReduceOp op, const Tensor& out, const Tensor& rows) = nullptr;

  // a (and b for the backward ops) contiguous, one shape and floating dtype; out contiguous, same
  // shape and dtype. Forward: a = x. Backward: a = grad_y, b = y.
  void (*softmax)(DeviceSoftmaxOp op, const Tensor& out, const Tensor& a, const Tensor& b, int64_t dim) = nullptr;

  // a (..., M, K) @ b (..., K, N) -> out (batch..., M, N) contiguous, with batch the broadcast of the
  // leading dims; K > 0. a and b have one floating dtype and either of their last two strides equal
  // to 1 (transposed views are read in place).
  void (*matmul)(const Tensor& out, const Tensor& a, const Tensor& b) = nullptr;
};

// Installs the table for a device type (nullptr removes it). The table must outlive its use.
void register_device_ops(DeviceType type, const DeviceOps* ops);
// The table for a device type, or nullptr when none is registered.
const DeviceOps* find_device_ops(DeviceType type);

// True when `device` is the CPU or its table has `entry`.
template <class Fn>
bool has_kernel(Device device, Fn DeviceOps::*entry) {
  if (device.is_cpu()) return true;
  const DeviceOps* ops = find_device_ops(device.type);
  return ops != nullptr && ops->*entry != nullptr;
}

// The entry for a non-CPU device; throws "<op>: no kernel for device <device> in this build".
template <class Fn>
Fn device_kernel(Device device, Fn DeviceOps::*entry, const char* op) {
  const DeviceOps* ops = find_device_ops(device.type);
  CPF_CHECK(!device.is_cpu() && ops != nullptr && ops->*entry != nullptr, op, ": no kernel for device ", device,
            " in this build");
  return ops->*entry;
}

}  // namespace cpf
