#pragma once
// Naive references of the element-wise kernels (framework/tensor/ops/elementwise.h) for its tests:
// numpy broadcasting written independently of broadcast_shapes, each op in double, and the tolerances.
#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/tensor.h"

namespace cpf::testing {

using raw::BinaryOp;
using raw::CompareOp;
using raw::UnaryOp;
// numpy broadcast of two shapes, written independently of broadcast_shapes.
inline Shape naive_broadcast(const Shape& a, const Shape& b) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i + a.size() >= n ? a[i + a.size() - n] : 1;
    const int64_t db = i + b.size() >= n ? b[i + b.size() - n] : 1;
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// Flat row-major index into a tensor of shape `in` for the broadcast multi-index of `flat` in `out`.
inline int64_t source_index(int64_t flat, const Shape& out, const Shape& in) {
  int64_t index = 0, scale = 1;
  for (int64_t d = static_cast<int64_t>(out.size()) - 1; d >= 0; --d) {
    const int64_t coord = flat % out[d];
    flat /= out[d];
    const int64_t din = d - static_cast<int64_t>(out.size() - in.size());
    if (din < 0) continue;
    if (in[din] != 1) index += coord * scale;
    scale *= in[din];
  }
  return index;
}

// out = f(a, b) with broadcasting, computed in double over the inputs' values.
inline std::vector<double> naive_binary(const Tensor& a, const Tensor& b,
                                        const std::function<double(double, double)>& f, Shape* shape_out = nullptr) {
  const Shape shape = naive_broadcast(a.shape(), b.shape());
  const auto av = a.to_vector<double>(), bv = b.to_vector<double>();
  std::vector<double> out(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = f(av[source_index(static_cast<int64_t>(i), shape, a.shape())],
               bv[source_index(static_cast<int64_t>(i), shape, b.shape())]);
  }
  if (shape_out) *shape_out = shape;
  return out;
}

Tensor as_f64(const std::vector<double>& values, const Shape& shape) { return from_vector<double>(values, shape); }

inline double ref_unary(UnaryOp op, double x) {
  constexpr double k = 0.7978845608028654;
  switch (op) {
    case UnaryOp::neg: return -x;
    case UnaryOp::exp: return std::exp(x);
    case UnaryOp::log: return std::log(x);
    case UnaryOp::sqrt: return std::sqrt(x);
    case UnaryOp::rsqrt: return 1 / std::sqrt(x);
    case UnaryOp::tanh: return std::tanh(x);
    case UnaryOp::gelu: return 0.5 * x * (1 + std::tanh(k * (x + 0.044715 * x * x * x)));
    case UnaryOp::silu: return x / (1 + std::exp(-x));
    case UnaryOp::relu: return x > 0 ? x : 0;
    case UnaryOp::sigmoid: return 1 / (1 + std::exp(-x));
    case UnaryOp::abs: return std::fabs(x);
    case UnaryOp::square: return x * x;
    case UnaryOp::reciprocal: return 1 / x;
  }
  return NAN;
}

// Derivatives by central differences of the reference (in double, step 1e-6).
inline double ref_derivative(UnaryOp op, double x) {
  const double h = 1e-6;
  return (ref_unary(op, x + h) - ref_unary(op, x - h)) / (2 * h);
}

inline double ref_binary(BinaryOp op, double a, double b) {
  switch (op) {
    case BinaryOp::add: return a + b;
    case BinaryOp::sub: return a - b;
    case BinaryOp::mul: return a * b;
    case BinaryOp::div: return a / b;
    case BinaryOp::pow: return std::pow(a, b);
    case BinaryOp::maximum: return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b);
    case BinaryOp::minimum: return std::isnan(a) || std::isnan(b) ? NAN : std::min(a, b);
  }
  return NAN;
}

inline bool ref_compare(CompareOp op, double a, double b) {
  switch (op) {
    case CompareOp::eq: return a == b;
    case CompareOp::ne: return a != b;
    case CompareOp::lt: return a < b;
    case CompareOp::le: return a <= b;
    case CompareOp::gt: return a > b;
    case CompareOp::ge: return a >= b;
  }
  return false;
}

inline const UnaryOp kUnaryOps[] = {UnaryOp::neg,  UnaryOp::exp,    UnaryOp::log,       UnaryOp::sqrt, UnaryOp::rsqrt,
                                    UnaryOp::tanh, UnaryOp::gelu,   UnaryOp::silu,      UnaryOp::relu, UnaryOp::sigmoid,
                                    UnaryOp::abs,  UnaryOp::square, UnaryOp::reciprocal};
inline const BinaryOp kBinaryOps[] = {BinaryOp::add, BinaryOp::sub,     BinaryOp::mul,    BinaryOp::div,
                                      BinaryOp::pow, BinaryOp::maximum, BinaryOp::minimum};
inline const CompareOp kCompareOps[] = {CompareOp::eq, CompareOp::ne, CompareOp::lt,
                                        CompareOp::le, CompareOp::gt, CompareOp::ge};

inline bool positive_domain(UnaryOp op) {
  return op == UnaryOp::log || op == UnaryOp::sqrt || op == UnaryOp::rsqrt || op == UnaryOp::reciprocal;
}

// Tolerances per dtype: f64 tight, f32 at float rounding, bf16 one rounding of the result.
inline double tol(DType dtype) { return dtype == DType::f64 ? 1e-12 : dtype == DType::f32 ? 2e-6 : 1e-2; }

}  // namespace cpf::testing
