#pragma once
// Element-wise math with numpy broadcasting (non-differentiable kernels; autograd wraps them).
// Inputs of a binary op must share dtype and device. f32/f64 compute natively; bf16 computes in f32
// and rounds once on output; integer dtypes support the arithmetic ops and comparisons (overflow wraps,
// division truncates and a zero divisor throws). maximum/minimum propagate NaN, as numpy does.
#include "framework/tensor/tensor.h"

namespace cpf::raw {

enum class UnaryOp { neg, exp, log, sqrt, rsqrt, tanh, gelu, silu, relu, sigmoid, abs, square, reciprocal };
enum class BinaryOp { add, sub, mul, div, pow, maximum, minimum };
enum class CompareOp { eq, ne, lt, le, gt, ge };

const char* op_name(UnaryOp op);
const char* op_name(BinaryOp op);

Tensor unary(UnaryOp op, const Tensor& x);
// grad * d op(x)/dx; y = op(x) is passed so ops whose derivative is cheapest from the output use it.
Tensor unary_backward(UnaryOp op, const Tensor& grad, const Tensor& x, const Tensor& y);
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);
Tensor binary(BinaryOp op, const Tensor& a, double b);           // b as a scalar of a's dtype
Tensor compare(CompareOp op, const Tensor& a, const Tensor& b);  // -> bool
Tensor compare(CompareOp op, const Tensor& a, double b);

// In place: dst += alpha * src (src broadcast to dst), dst *= value. Bump dst's version.
void add_(const Tensor& dst, const Tensor& src, double alpha = 1.0);
void mul_(const Tensor& dst, double value);

// cond ? a : b with broadcasting; cond is bool.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);

inline Tensor add(const Tensor& a, const Tensor& b) { return binary(BinaryOp::add, a, b); }
inline Tensor sub(const Tensor& a, const Tensor& b) { return binary(BinaryOp::sub, a, b); }
inline Tensor mul(const Tensor& a, const Tensor& b) { return binary(BinaryOp::mul, a, b); }
inline Tensor div(const Tensor& a, const Tensor& b) { return binary(BinaryOp::div, a, b); }
inline Tensor mul(const Tensor& a, double b) { return binary(BinaryOp::mul, a, b); }
inline Tensor add(const Tensor& a, double b) { return binary(BinaryOp::add, a, b); }
inline Tensor neg(const Tensor& a) { return unary(UnaryOp::neg, a); }
inline Tensor exp(const Tensor& a) { return unary(UnaryOp::exp, a); }
inline Tensor log(const Tensor& a) { return unary(UnaryOp::log, a); }

}  // namespace cpf::raw
