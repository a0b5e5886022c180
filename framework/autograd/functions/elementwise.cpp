#include "framework/autograd/functions/elementwise.h"

#include "framework/autograd/grad_mode.h"
#include "framework/autograd/node.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/reduce.h"

namespace cpf {
namespace {

using autograd::GradList;
using autograd::SavedTensor;
using raw::BinaryOp;
using raw::UnaryOp;

Tensor unary_op(UnaryOp op, const Tensor& x) {
  Tensor y = raw::unary(op, x);
  return autograd::record(raw::op_name(op), y, {x}, [op, sx = SavedTensor(x), sy = SavedTensor(y)](const GradList& g) {
    return GradList{raw::unary_backward(op, g[0], sx.unpack(), sy.unpack())};
  });
}

// Gradients of a broadcasting binary op, summed back to each input's shape.
GradList reduce_to_inputs(const Tensor& ga, const Tensor& gb, const Shape& a_shape, const Shape& b_shape) {
  return {ga.defined() ? raw::sum_to(ga, a_shape) : Tensor(), gb.defined() ? raw::sum_to(gb, b_shape) : Tensor()};
}

void check_not_in_graph(const Tensor& t, const char* op) {
  CPF_CHECK(!(grad_enabled() && t.requires_grad()), op, ": in-place update of a tensor of shape ", t.shape(),
            " that requires grad; use the out-of-place op, or wrap the update in NoGradGuard if it is a parameter "
            "update");
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  return autograd::record("add", raw::add(a, b), {a, b}, [as = a.shape(), bs = b.shape()](const GradList& g) {
    return reduce_to_inputs(g[0], g[0], as, bs);
  });
}

Tensor sub(const Tensor& a, const Tensor& b) {
  return autograd::record("sub", raw::sub(a, b), {a, b}, [as = a.shape(), bs = b.shape()](const GradList& g) {
    return reduce_to_inputs(g[0], raw::neg(g[0]), as, bs);
  });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  return autograd::record("mul", raw::mul(a, b), {a, b}, [sa = SavedTensor(a), sb = SavedTensor(b)](const GradList& g) {
    const Tensor& av = sa.unpack();
    const Tensor& bv = sb.unpack();
    return reduce_to_inputs(raw::mul(g[0], bv), raw::mul(g[0], av), av.shape(), bv.shape());
  });
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor y = raw::div(a, b);
  return autograd::record("div", y, {a, b}, [sa = SavedTensor(a), sb = SavedTensor(b)](const GradList& g) {
    const Tensor& av = sa.unpack();
    const Tensor& bv = sb.unpack();
    Tensor ga = raw::div(g[0], bv);
    Tensor gb = raw::neg(raw::div(raw::mul(ga, av), bv));  // -g * a / b^2
    return reduce_to_inputs(ga, gb, av.shape(), bv.shape());
  });
}

Tensor pow(const Tensor& a, const Tensor& b) {
  Tensor y = raw::binary(BinaryOp::pow, a, b);
  return autograd::record("pow", y, {a, b},
                          [sa = SavedTensor(a), sb = SavedTensor(b), sy = SavedTensor(y)](const GradList& g) {
                            const Tensor& av = sa.unpack();
                            const Tensor& bv = sb.unpack();
                            const Tensor& yv = sy.unpack();
                            // d/da = b * a^(b-1); d/db = y * log(a)
                            Tensor da = raw::mul(bv, raw::binary(BinaryOp::pow, av, raw::add(bv, -1.0)));
                            Tensor ga = raw::mul(g[0], da);
                            Tensor gb = raw::mul(g[0], raw::mul(yv, raw::log(av)));
                            return reduce_to_inputs(ga, gb, av.shape(), bv.shape());
                          });
}

Tensor pow(const Tensor& a, double exponent) {
  Tensor y = raw::binary(BinaryOp::pow, a, exponent);
  return autograd::record("pow", y, {a}, [sa = SavedTensor(a), exponent](const GradList& g) {
    const Tensor& av = sa.unpack();
    return GradList{raw::mul(g[0], raw::mul(raw::binary(BinaryOp::pow, av, exponent - 1.0), exponent))};
  });
}

Tensor maximum(const Tensor& a, const Tensor& b) {
  return autograd::record("maximum", raw::binary(BinaryOp::maximum, a, b), {a, b},
                          [sa = SavedTensor(a), sb = SavedTensor(b)](const GradList& g) {
                            const Tensor& av = sa.unpack();
                            const Tensor& bv = sb.unpack();
                            Tensor pick_a = raw::compare(raw::CompareOp::ge, av, bv);
                            Tensor zero = zeros({}, {.dtype = g[0].dtype(), .device = g[0].device()});
                            return reduce_to_inputs(raw::where(pick_a, g[0], zero), raw::where(pick_a, zero, g[0]),
                                                    av.shape(), bv.shape());
                          });
}

Tensor minimum(const Tensor& a, const Tensor& b) {
  return autograd::record("minimum", raw::binary(BinaryOp::minimum, a, b), {a, b},
                          [sa = SavedTensor(a), sb = SavedTensor(b)](const GradList& g) {
                            const Tensor& av = sa.unpack();
                            const Tensor& bv = sb.unpack();
                            Tensor pick_a = raw::compare(raw::CompareOp::le, av, bv);
                            Tensor zero = zeros({}, {.dtype = g[0].dtype(), .device = g[0].device()});
                            return reduce_to_inputs(raw::where(pick_a, g[0], zero), raw::where(pick_a, zero, g[0]),
                                                    av.shape(), bv.shape());
                          });
}

Tensor add(const Tensor& a, double b) {
  return autograd::record("add", raw::add(a, b), {a}, [](const GradList& g) { return GradList{g[0]}; });
}

Tensor mul(const Tensor& a, double b) {
  return autograd::record("mul", raw::mul(a, b), {a}, [b](const GradList& g) { return GradList{raw::mul(g[0], b)}; });
}

Tensor neg(const Tensor& x) { return unary_op(UnaryOp::neg, x); }
Tensor exp(const Tensor& x) { return unary_op(UnaryOp::exp, x); }
Tensor log(const Tensor& x) { return unary_op(UnaryOp::log, x); }
Tensor sqrt(const Tensor& x) { return unary_op(UnaryOp::sqrt, x); }
Tensor rsqrt(const Tensor& x) { return unary_op(UnaryOp::rsqrt, x); }
Tensor tanh(const Tensor& x) { return unary_op(UnaryOp::tanh, x); }
Tensor gelu(const Tensor& x) { return unary_op(UnaryOp::gelu, x); }
Tensor silu(const Tensor& x) { return unary_op(UnaryOp::silu, x); }
Tensor relu(const Tensor& x) { return unary_op(UnaryOp::relu, x); }
Tensor sigmoid(const Tensor& x) { return unary_op(UnaryOp::sigmoid, x); }
Tensor abs(const Tensor& x) { return unary_op(UnaryOp::abs, x); }
Tensor square(const Tensor& x) { return unary_op(UnaryOp::square, x); }

void add_(const Tensor& dst, const Tensor& src, double alpha) {
  check_not_in_graph(dst, "add_");
  raw::add_(dst, src, alpha);
}
void mul_(const Tensor& dst, double value) {
  check_not_in_graph(dst, "mul_");
  raw::mul_(dst, value);
}
void fill_(const Tensor& dst, double value) {
  check_not_in_graph(dst, "fill_");
  raw::fill_(dst, value);
}
void zero_(const Tensor& dst) { fill_(dst, 0.0); }
void copy_(const Tensor& dst, const Tensor& src) {
  check_not_in_graph(dst, "copy_");
  raw::copy_(dst, src);
}

}  // namespace cpf
