#include "framework/tensor/ops/elementwise.h"

#include <atomic>
#include <cmath>
#include <optional>
#include <type_traits>

#include "framework/tensor/cpu/strided_loop.h"
#include "framework/tensor/cpu/transcendental.h"
#include "framework/tensor/device_ops.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/shape_utils.h"

namespace cpf::raw {
namespace {

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kGeluCoeff = 0.044715;

template <UnaryOp op, class T>
T apply_unary(T x) {
  switch (op) {
    case UnaryOp::neg: return -x;
    case UnaryOp::exp: return std::exp(x);
    case UnaryOp::log: return std::log(x);
    case UnaryOp::sqrt: return std::sqrt(x);
    case UnaryOp::rsqrt: return T(1) / std::sqrt(x);
    case UnaryOp::tanh: return std::tanh(x);
    case UnaryOp::gelu: return T(0.5) * x * (T(1) + std::tanh(T(kSqrt2OverPi) * (x + T(kGeluCoeff) * x * x * x)));
    case UnaryOp::silu: return x / (T(1) + std::exp(-x));
    case UnaryOp::relu: return x > T(0) ? x : T(0);
    case UnaryOp::sigmoid: return T(1) / (T(1) + std::exp(-x));
    case UnaryOp::abs: return std::abs(x);
    case UnaryOp::square: return x * x;
    case UnaryOp::reciprocal: return T(1) / x;
  }
  return x;
}

// d op / dx at x (y = op(x)).
template <class T>
T unary_derivative(UnaryOp op, T x, T y) {
  switch (op) {
    case UnaryOp::neg: return T(-1);
    case UnaryOp::exp: return y;
    case UnaryOp::log: return T(1) / x;
    case UnaryOp::sqrt: return T(0.5) / y;
    case UnaryOp::rsqrt: return T(-0.5) * y * y * y;
    case UnaryOp::tanh: return T(1) - y * y;
    case UnaryOp::gelu: {
      const T inner = T(kSqrt2OverPi) * (x + T(kGeluCoeff) * x * x * x);
      const T t = std::tanh(inner);
      return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * T(kSqrt2OverPi) * (T(1) + T(3 * kGeluCoeff) * x * x);
    }
    case UnaryOp::silu: {
      const T s = T(1) / (T(1) + std::exp(-x));
      return s * (T(1) + x * (T(1) - s));
    }
    case UnaryOp::relu: return x > T(0) ? T(1) : T(0);
    case UnaryOp::sigmoid: return y * (T(1) - y);
    case UnaryOp::abs: return x > T(0) ? T(1) : (x < T(0) ? T(-1) : T(0));
    case UnaryOp::square: return T(2) * x;
    case UnaryOp::reciprocal: return -y * y;
  }
  return T(0);
}

// Signed integer overflow is undefined behaviour in C++: compute in the unsigned type so it wraps, as
// the hardware (and PyTorch) do.
template <class T, class F>
T wrapping(T a, T b, F&& f) {
  if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(f(static_cast<U>(a), static_cast<U>(b))));
  } else {
    return f(a, b);
  }
}

template <class T>
bool is_nan(T x) {
  if constexpr (std::is_floating_point_v<T>) {
    return std::isnan(x);
  } else {
    return false;
  }
}

template <BinaryOp op, class T>
T apply_binary(T a, T b) {
  switch (op) {
    case BinaryOp::add: return wrapping(a, b, [](auto x, auto y) { return x + y; });
    case BinaryOp::sub: return wrapping(a, b, [](auto x, auto y) { return x - y; });
    case BinaryOp::mul: return wrapping(a, b, [](auto x, auto y) { return x * y; });
    case BinaryOp::div: return a / b;
    case BinaryOp::pow:
      if constexpr (std::is_floating_point_v<T>)
        return std::pow(a, b);
      else
        return static_cast<T>(std::pow(static_cast<double>(a), static_cast<double>(b)));
    // NaN wins, as in numpy/PyTorch: a comparison alone would silently drop it.
    case BinaryOp::maximum: return (a > b || is_nan(a)) ? a : b;
    case BinaryOp::minimum: return (a < b || is_nan(a)) ? a : b;
  }
  return a;
}

template <class T>
bool apply_compare(CompareOp op, T a, T b) {
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

// The CPU, or a device whose kernel table (framework/tensor/device_ops.h) has `entry`.
template <class Fn>
void check_kernel(const Tensor& t, Fn DeviceOps::*entry, const char* op) {
  CPF_CHECK(has_kernel(t.device(), entry), op, ": no kernel for device ", t.device(), " in this build");
}

// Turns a runtime op into a template argument so each inner loop is specialised (and vectorised).
template <class Fn>
void visit_unary_op(UnaryOp op, Fn&& fn) {
  switch (op) {
#define CPF_CASE(name) \
  case UnaryOp::name: fn.template operator()<UnaryOp::name>(); return;
    // One case per line, kept by hand: clang-format 14 reflows a run of macro calls differently each pass.
    // clang-format off
    CPF_CASE(neg)
    CPF_CASE(exp)
    CPF_CASE(log)
    CPF_CASE(sqrt)
    CPF_CASE(rsqrt)
    CPF_CASE(tanh)
    CPF_CASE(gelu)
    CPF_CASE(silu)
    CPF_CASE(relu)
    CPF_CASE(sigmoid)
    CPF_CASE(abs)
    CPF_CASE(square)
    CPF_CASE(reciprocal)
    // clang-format on
#undef CPF_CASE
  }
}

template <class Fn>
void visit_binary_op(BinaryOp op, Fn&& fn) {
  switch (op) {
#define CPF_CASE(name) \
  case BinaryOp::name: fn.template operator()<BinaryOp::name>(); return;
    CPF_CASE(add) CPF_CASE(sub) CPF_CASE(mul) CPF_CASE(div) CPF_CASE(pow) CPF_CASE(maximum) CPF_CASE(minimum)
#undef CPF_CASE
  }
}

Tensor to_f32(const Tensor& t) { return to(t, DType::f32); }

// Kernels are written once for T in {float, double, int32_t, int64_t}; bf16 inputs are widened to
// f32 and the result is rounded back.
template <class Fn>
Tensor with_bf16_as_f32(const Tensor& x, Fn&& fn) {
  if (x.dtype() != DType::bf16) return fn(x);
  return to(fn(to_f32(x)), DType::bf16);
}

}  // namespace

const char* op_name(UnaryOp op) {
  static const char* names[] = {"neg",  "exp",  "log",     "sqrt", "rsqrt",  "tanh",      "gelu",
                                "silu", "relu", "sigmoid", "abs",  "square", "reciprocal"};
  return names[static_cast<int>(op)];
}

const char* op_name(BinaryOp op) {
  static const char* names[] = {"add", "sub", "mul", "div", "pow", "maximum", "minimum"};
  return names[static_cast<int>(op)];
}

// Ops with a vectorised f32 kernel for contiguous inputs (cpu/transcendental.h).
static std::optional<cpu::FastUnary> fast_unary_of(UnaryOp op) {
  switch (op) {
    case UnaryOp::exp: return cpu::FastUnary::exp;
    case UnaryOp::sigmoid: return cpu::FastUnary::sigmoid;
    case UnaryOp::silu: return cpu::FastUnary::silu;
    case UnaryOp::gelu: return cpu::FastUnary::gelu;
    default: return std::nullopt;
  }
}

Tensor unary(UnaryOp op, const Tensor& x) {
  check_defined(x, op_name(op), "x");
  check_kernel(x, &DeviceOps::unary, op_name(op));
  if (op == UnaryOp::neg || op == UnaryOp::abs || op == UnaryOp::square) {
    CPF_CHECK(x.dtype() != DType::boolean, op_name(op), ": not defined for bool tensors");
  } else {
    CPF_CHECK(is_floating(x.dtype()), op_name(op), ": needs a floating tensor, got ", x.dtype(), " ", x.shape());
  }
  if (!x.device().is_cpu()) {
    Tensor out = empty(x.shape(), {.dtype = x.dtype(), .device = x.device()});
    device_kernel(x.device(), &DeviceOps::unary, op_name(op))(op, out, x);
    return out;
  }
  return with_bf16_as_f32(x, [&](const Tensor& in) {
    Tensor out = empty(in.shape(), {.dtype = in.dtype(), .device = in.device()});
    if (auto fast = fast_unary_of(op); fast && in.dtype() == DType::f32 && in.is_contiguous()) {
      cpu::fast_unary_f32(*fast, in.data<float>(), out.data<float>(), in.numel());
      return out;
    }
    visit_dtype(in.dtype(), [&]<class T>() {
      if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
        visit_unary_op(op, [&]<UnaryOp Op>() {
          cpu::map_elements<T, T>(
              out, [](T v) { return apply_unary<Op, T>(v); }, in);
        });
      }
    });
    return out;
  });
}

Tensor unary_backward(UnaryOp op, const Tensor& grad, const Tensor& x, const Tensor& y) {
  check_same_dtype(grad, x, op_name(op));
  CPF_CHECK(grad.shape() == x.shape() && y.shape() == x.shape(), op_name(op), " backward: grad ", grad.shape(), ", x ",
            x.shape(), " and y ", y.shape(), " must have one shape");
  check_same_device(grad, x, op_name(op));
  check_same_device(y, x, op_name(op));
  check_kernel(x, &DeviceOps::unary_backward, op_name(op));
  if (!x.device().is_cpu()) {
    CPF_CHECK(is_floating(x.dtype()), op_name(op), " backward: needs floating tensors, got ", x.dtype());
    Tensor out = empty(x.shape(), {.dtype = x.dtype(), .device = x.device()});
    device_kernel(x.device(), &DeviceOps::unary_backward, op_name(op))(op, out, grad, x, y);
    return out;
  }
  if (x.dtype() == DType::bf16) {
    return to(unary_backward(op, to_f32(grad), to_f32(x), to_f32(y)), DType::bf16);
  }
  Tensor out = empty(x.shape(), {.dtype = x.dtype(), .device = x.device()});
  visit_compute_dtype(x.dtype(), op_name(op), [&]<class T>() {
    cpu::map_elements<T, T, T, T>(
        out, [op](T g, T xv, T yv) { return g * unary_derivative<T>(op, xv, yv); }, grad, x, y);
  });
  return out;
}

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  check_defined(a, op_name(op), "a");
  check_defined(b, op_name(op), "b");
  check_same_dtype(a, b, op_name(op));
  check_same_device(a, b, op_name(op));
  check_kernel(a, &DeviceOps::binary, op_name(op));
  CPF_CHECK(a.dtype() != DType::boolean, op_name(op), ": not defined for bool tensors");
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), op_name(op));
  if (!a.device().is_cpu()) {
    Tensor out = empty(shape, {.dtype = a.dtype(), .device = a.device()});
    device_kernel(a.device(), &DeviceOps::binary, op_name(op))(op, out, a, b);
    return out;
  }
  if (a.dtype() == DType::bf16) return to(binary(op, to_f32(a), to_f32(b)), DType::bf16);
  Tensor out = empty(shape, {.dtype = a.dtype(), .device = a.device()});
  visit_dtype(a.dtype(), [&]<class T>() {
    if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
      if (op == BinaryOp::div && std::is_integral_v<T>) {
        // The loop may run on OpenMP threads, where an exception would terminate the process:
        // flag a zero divisor and throw after the loop.
        std::atomic<bool> by_zero{false};
        cpu::map_elements<T, T, T>(
            out,
            [&by_zero](T x, T y) {
              if (y == 0) {
                by_zero.store(true, std::memory_order_relaxed);
                return T(0);
              }
              if constexpr (std::is_signed_v<T>) {
                if (y == T(-1)) return wrapping<T>(T(0), x, [](auto p, auto q) { return p - q; });  // INT_MIN / -1
              }
              return static_cast<T>(x / y);
            },
            a, b);
        CPF_CHECK(!by_zero.load(), "div: integer division by zero (divisor of shape ", b.shape(), ")");
      } else {
        visit_binary_op(op, [&]<BinaryOp Op>() {
          cpu::map_elements<T, T, T>(
              out, [](T x, T y) { return apply_binary<Op, T>(x, y); }, a, b);
        });
      }
    }
  });
  return out;
}

Tensor binary(BinaryOp op, const Tensor& a, double b) {
  return binary(op, a, full({}, b, {.dtype = a.dtype(), .device = a.device()}));
}

Tensor compare(CompareOp op, const Tensor& a, const Tensor& b) {
  check_defined(a, "compare", "a");
  check_defined(b, "compare", "b");
  check_same_dtype(a, b, "compare");
  check_same_device(a, b, "compare");
  check_kernel(a, &DeviceOps::compare, "compare");
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), "compare");
  if (!a.device().is_cpu()) {
    Tensor out = empty(shape, {.dtype = DType::boolean, .device = a.device()});
    device_kernel(a.device(), &DeviceOps::compare, "compare")(op, out, a, b);
    return out;
  }
  if (a.dtype() == DType::bf16) return compare(op, to_f32(a), to_f32(b));
  Tensor out = empty(shape, {.dtype = DType::boolean, .device = a.device()});
  visit_dtype(a.dtype(), [&]<class T>() {
    if constexpr (!std::is_same_v<T, bfloat16>) {
      cpu::map_elements<bool, T, T>(
          out, [op](T x, T y) { return apply_compare<T>(op, x, y); }, a, b);
    }
  });
  return out;
}

Tensor compare(CompareOp op, const Tensor& a, double b) {
  return compare(op, a, full({}, b, {.dtype = a.dtype(), .device = a.device()}));
}

void add_(const Tensor& dst, const Tensor& src, double alpha) {
  check_defined(dst, "add_", "dst");
  check_defined(src, "add_", "src");
  check_same_dtype(dst, src, "add_");
  check_same_device(dst, src, "add_");
  check_kernel(dst, &DeviceOps::add_, "add_");
  CPF_CHECK(broadcast_shapes(dst.shape(), src.shape(), "add_") == dst.shape(), "add_: source ", src.shape(),
            " does not broadcast to destination ", dst.shape());
  if (!dst.device().is_cpu()) {
    CPF_CHECK(dst.dtype() != DType::boolean, "add_: not defined for bool tensors");
    CPF_CHECK(is_floating(dst.dtype()) || alpha == std::trunc(alpha), "add_: alpha=", alpha,
              " must be a whole number for a ", dst.dtype(), " tensor");
    device_kernel(dst.device(), &DeviceOps::add_, "add_")(dst, src, alpha);
    dst.bump_version();
    return;
  }
  visit_dtype(dst.dtype(), [&]<class T>() {
    if constexpr (std::is_same_v<T, bfloat16>) {
      const float a = static_cast<float>(alpha);
      cpu::map_elements<T, T, T>(
          dst, [a](T d, T s) { return T(float(d) + a * float(s)); }, dst, src);
    } else if constexpr (std::is_floating_point_v<T>) {
      const T a = static_cast<T>(alpha);
      cpu::map_elements<T, T, T>(
          dst, [a](T d, T s) { return static_cast<T>(d + a * s); }, dst, src);
    } else if constexpr (!std::is_same_v<T, bool>) {
      CPF_CHECK(alpha == std::trunc(alpha), "add_: alpha=", alpha, " must be a whole number for a ", dst.dtype(),
                " tensor");
      const T a = static_cast<T>(alpha);
      auto plus = [](auto x, auto y) { return x + y; };
      auto times = [](auto x, auto y) { return x * y; };
      cpu::map_elements<T, T, T>(
          dst, [=](T d, T s) { return wrapping(d, wrapping(a, s, times), plus); }, dst, src);
    } else {
      CPF_FAIL("add_: not defined for bool tensors");
    }
  });
  dst.bump_version();
}

void mul_(const Tensor& dst, double value) {
  check_defined(dst, "mul_", "dst");
  check_kernel(dst, &DeviceOps::mul_, "mul_");
  if (!dst.device().is_cpu()) {
    CPF_CHECK(dst.dtype() != DType::boolean, "mul_: not defined for bool tensors");
    device_kernel(dst.device(), &DeviceOps::mul_, "mul_")(dst, value);
    dst.bump_version();
    return;
  }
  visit_dtype(dst.dtype(), [&]<class T>() {
    if constexpr (std::is_same_v<T, bfloat16>) {
      cpu::map_elements<T, T>(
          dst, [value](T d) { return T(float(d) * static_cast<float>(value)); }, dst);
    } else if constexpr (!std::is_same_v<T, bool>) {
      cpu::map_elements<T, T>(
          dst, [value](T d) { return static_cast<T>(d * value); }, dst);
    } else {
      CPF_FAIL("mul_: not defined for bool tensors");
    }
  });
  dst.bump_version();
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  check_defined(cond, "where", "cond");
  check_defined(a, "where", "a");
  check_defined(b, "where", "b");
  CPF_CHECK(cond.dtype() == DType::boolean, "where: condition must be bool, got ", cond.dtype());
  check_same_dtype(a, b, "where");
  check_same_device(a, b, "where");
  check_same_device(cond, a, "where");
  check_kernel(a, &DeviceOps::where, "where");
  const Shape shape = broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), "where"), b.shape(), "where");
  Tensor out = empty(shape, {.dtype = a.dtype(), .device = a.device()});
  if (!a.device().is_cpu()) {
    device_kernel(a.device(), &DeviceOps::where, "where")(out, cond, a, b);
    return out;
  }
  visit_dtype(a.dtype(), [&]<class T>() {
    cpu::map_elements<T, bool, T, T>(
        out, [](bool c, T x, T y) { return c ? x : y; }, cond, a, b);
  });
  return out;
}

}  // namespace cpf::raw
