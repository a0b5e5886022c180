#include "framework/tensor/ops/swiglu.h"

#include <cmath>

#include "framework/core/error.h"
#include "framework/tensor/bfloat16.h"
#include "framework/tensor/device_ops.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/views.h"
#include "framework/tensor/profile.h"
#include "framework/tensor/shape_utils.h"

namespace cpf::raw {
namespace {

// S: storage type; A: the type the gate is computed in.
template <class Fn>
void visit_storage(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::f32: fn.template operator()<float, float>(); return;
    case DType::f64: fn.template operator()<double, double>(); return;
    case DType::bf16: fn.template operator()<bfloat16, float>(); return;
    default: CPF_FAIL("swiglu: unsupported dtype ", dtype);
  }
}

// One stride between rows of the last dim when the leading dims fold into rows (unit stride along it).
bool folds_to_rows(const Tensor& t) {
  if (t.dim() == 0 || t.stride(-1) != 1) return false;
  for (int64_t d = 0; d + 2 < t.dim(); ++d) {
    if (t.size(d) != 1 && t.stride(d) != t.stride(d + 1) * t.size(d + 1)) return false;
  }
  return true;
}

// t as a (rows, cols) view with unit column stride: a copy only when its strides do not fold.
Tensor as_rows(const Tensor& t) {
  const Tensor f = folds_to_rows(t) ? t : contiguous(t);
  const int64_t cols = f.size(-1), rows = cols == 0 ? 0 : f.numel() / cols;
  const int64_t row_stride = f.dim() >= 2 ? f.stride(-2) : cols;
  return as_strided(f, {rows, cols}, {rows > 1 ? row_stride : cols, 1}, f.offset());
}

void check_pair(const Tensor& gate, const Tensor& up, const char* op) {
  check_defined(gate, op, "gate");
  check_defined(up, op, "up");
  CPF_CHECK(gate.shape() == up.shape(), op, ": gate and up must have the same shape: gate=", gate.shape(),
            " up=", up.shape());
  CPF_CHECK(gate.dim() >= 1, op, ": gate and up need at least one dim (..., I), got a scalar");
  CPF_CHECK(gate.dtype() == up.dtype(), op, ": gate and up must have the same dtype: gate=", gate.dtype(),
            " up=", up.dtype());
  CPF_CHECK(gate.dtype() == DType::f32 || gate.dtype() == DType::f64 || gate.dtype() == DType::bf16, op,
            ": gate and up must be f32, f64 or bf16, got ", gate.dtype());
  CPF_CHECK(gate.device() == up.device(), op, ": gate is on ", gate.device(), " but up is on ", up.device());
}

template <class A>
A sigmoid(A g) {
  return A(1) / (A(1) + std::exp(-g));
}

// The CPU reference of both kernels over (rows, cols) views; dy null: forward (out), else backward.
void swiglu_cpu(const Tensor& g, const Tensor& u, const Tensor& dy, const Tensor& out, const Tensor& dg,
                const Tensor& du) {
  visit_storage(g.dtype(), [&]<class S, class A>() {
    const int64_t rows = g.size(0), cols = g.size(1);
    // Pointers and strides read once: Tensor::data<S>() checks the dtype on every call.
    const S *g0 = g.data<S>(), *u0 = u.data<S>();
    const int64_t gs = g.stride(0), us = u.stride(0);
    if (!dy.defined()) {
      S* o0 = out.data<S>();
      for (int64_t r = 0; r < rows; ++r) {
        const S *gr = g0 + r * gs, *ur = u0 + r * us;
        S* orow = o0 + r * cols;
        for (int64_t c = 0; c < cols; ++c) {
          const A gv = static_cast<A>(gr[c]);
          orow[c] = static_cast<S>(gv * sigmoid(gv) * static_cast<A>(ur[c]));
        }
      }
      return;
    }
    const S* d0 = dy.data<S>();
    S *du0 = du.data<S>(), *dg0 = dg.data<S>();
    const int64_t ds = dy.stride(0), dus = du.stride(0), dgs = dg.stride(0);
    for (int64_t r = 0; r < rows; ++r) {
      const S *gr = g0 + r * gs, *ur = u0 + r * us, *dr = d0 + r * ds;
      S *dur = du0 + r * dus, *dgr = dg0 + r * dgs;
      for (int64_t c = 0; c < cols; ++c) {
        const A gv = static_cast<A>(gr[c]), uv = static_cast<A>(ur[c]), d = static_cast<A>(dr[c]);
        const A s = sigmoid(gv);
        dur[c] = static_cast<S>(d * gv * s);
        dgr[c] = static_cast<S>(d * uv * s * (A(1) + gv * (A(1) - s)));
      }
    }
  });
}

}  // namespace

Tensor swiglu(const Tensor& gate, const Tensor& up) {
  const char* op = "swiglu";
  check_pair(gate, up, op);
  CPF_CHECK(has_kernel(gate.device(), &DeviceOps::swiglu), op, ": no kernel for device ", gate.device(),
            " in this build");
  Tensor out = empty(gate.shape(), {.dtype = gate.dtype(), .device = gate.device()});  // (..., I)
  if (out.numel() == 0) return out;
  const Tensor g = as_rows(gate), u = as_rows(up);  // (N, I)
  const Tensor o = view(out, {g.size(0), g.size(1)});
  if (gate.device().is_cpu()) {
    swiglu_cpu(g, u, Tensor(), o, Tensor(), Tensor());
  } else {
    device_kernel(gate.device(), &DeviceOps::swiglu, op)(o, g, u);
    profile::add_work(0, profile::tensor_bytes(g) + profile::tensor_bytes(u) + profile::tensor_bytes(o));
  }
  return out;
}

SwigluGrads swiglu_backward(const Tensor& grad_out, const Tensor& gate, const Tensor& up) {
  check_pair(gate, up, "swiglu_backward");
  const TensorOptions options{.dtype = gate.dtype(), .device = gate.device()};
  SwigluGrads grads{empty(gate.shape(), options), empty(gate.shape(), options)};  // (..., I) each
  swiglu_backward_into(grad_out, gate, up, grads.d_gate, grads.d_up);
  return grads;
}

void swiglu_backward_into(const Tensor& grad_out, const Tensor& gate, const Tensor& up, const Tensor& d_gate,
                          const Tensor& d_up) {
  const char* op = "swiglu_backward";
  check_pair(gate, up, op);
  check_defined(grad_out, op, "grad_out");
  CPF_CHECK(grad_out.shape() == gate.shape() && grad_out.dtype() == gate.dtype() && grad_out.device() == gate.device(),
            op, ": grad_out must have gate's shape, dtype and device: grad_out ", grad_out.shape(), " ",
            grad_out.dtype(), " on ", grad_out.device(), ", gate ", gate.shape(), " ", gate.dtype(), " on ",
            gate.device());
  for (const auto& [t, name] : {std::pair{&d_gate, "d_gate"}, std::pair{&d_up, "d_up"}}) {
    check_defined(*t, op, name);
    CPF_CHECK(
        t->shape() == gate.shape() && t->dtype() == gate.dtype() && t->device() == gate.device() && folds_to_rows(*t),
        op, ": ", name, " must have gate's shape ", gate.shape(), ", dtype ", gate.dtype(), " and device ",
        gate.device(), " with unit stride along the last dim and one stride between rows: got ", t->shape(), " ",
        t->dtype(), " on ", t->device(), " strides ", t->strides());
  }
  CPF_CHECK(has_kernel(gate.device(), &DeviceOps::swiglu_backward), op, ": no kernel for device ", gate.device(),
            " in this build");
  if (gate.numel() == 0) return;
  const Tensor g = as_rows(gate), u = as_rows(up), dy = as_rows(grad_out);  // (N, I)
  const Tensor dg = as_rows(d_gate), du = as_rows(d_up);                    // (N, I) views: written in place
  if (gate.device().is_cpu()) {
    swiglu_cpu(g, u, dy, Tensor(), dg, du);
  } else {
    device_kernel(gate.device(), &DeviceOps::swiglu_backward, op)(dg, du, dy, g, u);
    profile::add_work(0, profile::tensor_bytes(dy) + profile::tensor_bytes(g) + profile::tensor_bytes(u) +
                             profile::tensor_bytes(dg) + profile::tensor_bytes(du));
  }
}

}  // namespace cpf::raw
