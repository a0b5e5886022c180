#include "framework/tensor/ops/softmax.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "framework/tensor/cpu/compute_types.h"
#include "framework/tensor/cpu/softmax_kernels.h"
#include "framework/tensor/cpu/strided_loop.h"
#include "framework/tensor/device_ops.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/shape_utils.h"

namespace cpf::raw {
namespace {

// The input is made contiguous and viewed as (outer, size, inner) with `size` the softmax dim.
// inner == 1 (the softmax dim is last, the common case) works on whole rows; otherwise a block
// (size, inner) is processed a group of `w` adjacent columns at a time, each step along the softmax dim
// touching w contiguous elements, so both paths run as vectorised loops (Eigen arrays, SIMD exp) without a
// transpose and the output comes out in x's own layout.
enum class Op { softmax, log_softmax, softmax_backward, log_softmax_backward };

template <class T>
constexpr T kInf = std::numeric_limits<T>::infinity();

// Bytes a column group may span along the softmax dim: small enough that the block stays in cache
// between the max, exp and scale passes.
constexpr int64_t kBlockBytes = 1024 * 1024;
constexpr int64_t kMinGroup = 64;
constexpr int64_t kNarrowGroup = 16;

// One contiguous row of n elements: a = x (forward) or grad_y (backward), b = y (backward only).
// Exponentials go through cpu::exp_sum / exp_sub (SIMD for f32, exact 0 for -inf).
template <Op op, class T>
void row_kernel(const T* a, const T* b, T* out, int64_t n) {
  CMap<T> ar(a, n);
  Map<T> o(out, n);
  if constexpr (op == Op::softmax || op == Op::log_softmax) {
    const T m = ar.maxCoeff();
    if (m == -kInf<T> && !ar.isNaN().any()) {  // fully masked row (Eigen's max may skip a NaN)
      o.setConstant(op == Op::softmax ? T(0) : -kInf<T>);
      return;
    }
    if constexpr (op == Op::softmax) {
      o *= T(1) / cpu::exp_sum(a, m, out, n);
    } else {
      o = ar - (m + std::log(cpu::exp_sum(a, m, nullptr, n)));
    }
  } else if constexpr (op == Op::softmax_backward) {
    CMap<T> y(b, n);
    const T dot = (ar * y).sum();
    o = y * (ar - dot);
  } else {
    cpu::exp_sum(b, T(0), out, n);  // exp(y) = softmax
    o = ar - o * ar.sum();
  }
}

// Columns [0, w) of a (size, inner) block; pointers are at the group's first column of row 0.
// scratch holds 2 * w elements.
template <Op op, class T>
void block_kernel(const T* a, const T* b, T* out, int64_t size, int64_t inner, int64_t w, T* scratch) {
  Map<T> acc(scratch, w), aux(scratch + w, w);
  auto in = [&](const T* p, int64_t d) { return CMap<T>(p + d * inner, w); };
  auto res = [&](int64_t d) { return Map<T>(out + d * inner, w); };
  if constexpr (op == Op::softmax || op == Op::log_softmax) {
    Map<T>& m = acc;
    Map<T>& s = aux;
    m = in(a, 0);
    for (int64_t d = 1; d < size; ++d) m = m.max(in(a, d));
    // Fully masked columns shift by 0: exp(-inf - 0) = 0 instead of exp(-inf + inf) = NaN.
    m = (m == -kInf<T>).select(T(0), m);
    s.setZero();
    // exp(x - m) goes to the output rows: the result for softmax, a scratch row for log_softmax.
    for (int64_t d = 0; d < size; ++d) {
      cpu::exp_sub(a + d * inner, m.data(), out + d * inner, w);
      s += res(d);
    }
    if constexpr (op == Op::softmax) {
      s = (s == T(0)).select(T(0), s.inverse());  // masked columns: 0 * 0; NaN sums stay NaN
      for (int64_t d = 0; d < size; ++d) res(d) *= s;
    } else {
      // lse; masked columns use 0 so that x - lse stays -inf.
      s = (s == T(0)).select(T(0), m + s.log());
      for (int64_t d = 0; d < size; ++d) res(d) = in(a, d) - s;
    }
  } else if constexpr (op == Op::softmax_backward) {
    acc.setZero();
    for (int64_t d = 0; d < size; ++d) acc += in(a, d) * in(b, d);
    for (int64_t d = 0; d < size; ++d) res(d) = in(b, d) * (in(a, d) - acc);
  } else {
    acc.setZero();
    for (int64_t d = 0; d < size; ++d) acc += in(a, d);
    for (int64_t d = 0; d < size; ++d) {
      cpu::exp_sum(b + d * inner, T(0), out + d * inner, w);
      res(d) = in(a, d) - res(d) * acc;
    }
  }
}

void check_input(const Tensor& t, const char* op, const char* name) {
  check_defined(t, op, name);
  CPF_CHECK(has_kernel(t.device(), &DeviceOps::softmax), op, ": no kernel for device ", t.device(), " in this build");
  CPF_CHECK(is_floating(t.dtype()), op, ": '", name, "' must be a floating tensor (f32, f64 or bf16), got ", t.dtype());
}

void check_backward_inputs(const Tensor& grad_y, const Tensor& y, const char* op) {
  check_input(grad_y, op, "grad_y");
  check_input(y, op, "y");
  CPF_CHECK(grad_y.shape() == y.shape(), op, ": grad_y of shape ", grad_y.shape(), " does not match y of shape ",
            y.shape());
  check_same_dtype(grad_y, y, op);
}

// Applies `op` along `dim`; b is undefined for the forward ops. The result has a's dtype.
template <Op op>
Tensor run(const char* name, const Tensor& a, const Tensor& b, int64_t dim) {
  const int64_t d = normalize_dim(dim, a.dim(), name);
  if (b.defined()) check_same_device(a, b, name);
  if (!a.device().is_cpu()) {
    const Tensor ac = contiguous(a);
    const Tensor bc = b.defined() ? contiguous(b) : Tensor();
    Tensor out = empty(a.shape(), {.dtype = a.dtype(), .device = a.device()});
    device_kernel(a.device(), &DeviceOps::softmax, name)(static_cast<DeviceSoftmaxOp>(op), out, ac, bc, d);
    return out;
  }
  const DType dtype = a.dtype();
  const DType compute = dtype == DType::bf16 ? DType::f32 : dtype;
  const Tensor ac = contiguous(to(a, compute));
  const Tensor bc = b.defined() ? contiguous(to(b, compute)) : Tensor();
  Tensor out = empty(a.shape(), {.dtype = compute});
  if (out.numel() == 0) return to(out, dtype);

  int64_t outer = 1, size = 1, inner = 1;
  for (int64_t k = 0; k < a.dim(); ++k) {
    if (k < d)
      outer *= a.size(k);
    else if (k == d)
      size = a.size(k);
    else
      inner *= a.size(k);
  }
  const bool parallel = out.numel() >= cpu::kParallelGrain;

  visit_compute_dtype(compute, name, [&]<class T>() {
    const T* pa = ac.data<T>();
    const T* pb = bc.defined() ? bc.data<T>() : nullptr;
    T* po = out.data<T>();
    if (inner == 1) {
#if defined(CPF_WITH_OPENMP)
#pragma omp parallel for if (parallel && outer > 1) schedule(static)
#endif
      for (int64_t r = 0; r < outer; ++r) {
        row_kernel<op, T>(pa + r * size, pb ? pb + r * size : nullptr, po + r * size, size);
      }
      return;
    }
    int64_t group = kBlockBytes / (size * static_cast<int64_t>(sizeof(T)));
    group = std::min(inner, std::max(kMinGroup, group / kMinGroup * kMinGroup));
    if (parallel) {
      // Few outer blocks (softmax over a leading dim): narrower groups so every thread gets work.
      const int64_t threads = cpu::max_threads();
      while (group > kNarrowGroup && outer * ((inner + group - 1) / group) < threads) group /= 2;
    }
    const int64_t groups = (inner + group - 1) / group;
    const int64_t tasks = outer * groups;
#if defined(CPF_WITH_OPENMP)
#pragma omp parallel if (parallel && tasks > 1)
#endif
    {
      std::vector<T> scratch(static_cast<size_t>(2 * group));
#if defined(CPF_WITH_OPENMP)
#pragma omp for schedule(static)
#endif
      for (int64_t t = 0; t < tasks; ++t) {
        const int64_t o = t / groups;
        const int64_t j0 = (t % groups) * group;
        const int64_t off = o * size * inner + j0;
        block_kernel<op, T>(pa + off, pb ? pb + off : nullptr, po + off, size, inner, std::min(group, inner - j0),
                            scratch.data());
      }
    }
  });
  return to(out, dtype);
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) {
  check_input(x, "softmax", "x");
  return run<Op::softmax>("softmax", x, Tensor(), dim);
}

Tensor log_softmax(const Tensor& x, int64_t dim) {
  check_input(x, "log_softmax", "x");
  return run<Op::log_softmax>("log_softmax", x, Tensor(), dim);
}

Tensor softmax_backward(const Tensor& grad_y, const Tensor& y, int64_t dim) {
  check_backward_inputs(grad_y, y, "softmax_backward");
  return run<Op::softmax_backward>("softmax_backward", grad_y, y, dim);
}

Tensor log_softmax_backward(const Tensor& grad_y, const Tensor& y, int64_t dim) {
  check_backward_inputs(grad_y, y, "log_softmax_backward");
  return run<Op::log_softmax_backward>("log_softmax_backward", grad_y, y, dim);
}

}  // namespace cpf::raw
