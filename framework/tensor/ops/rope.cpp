#include "framework/tensor/ops/rope.h"

#include <cmath>
#include <type_traits>
#include <vector>

#include "framework/tensor/cpu/strided_loop.h"
#include "framework/tensor/device_ops.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/profile.h"
#include "framework/tensor/shape_utils.h"

namespace cpf::raw {
namespace {

// x's storage types; A is the type the rotation is applied in.
template <class Fn>
void visit_storage(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::f32: fn.template operator()<float, float>(); return;
    case DType::f64: fn.template operator()<double, double>(); return;
    case DType::bf16: fn.template operator()<bfloat16, float>(); return;
    default: CPF_FAIL("rope: unsupported dtype ", dtype);
  }
}

template <class Fn>
void visit_position_type(DType dtype, Fn&& fn) {
  if (dtype == DType::i32) {
    fn.template operator()<int32_t>();
  } else {
    fn.template operator()<int64_t>();
  }
}

// x's layout as rope sees it: (B, T, H, D), B = 1 for thd; rot = the rotary dim resolved.
struct RopeShape {
  bool thd = false, per_batch = false;
  int64_t batch = 1, seq = 0, heads = 0, dim = 0, rot = 0;
};

// Every input rule, in the order the messages are tested.
RopeShape check_rope_inputs(const Tensor& x, const Tensor& positions, const RopeFrequencies& f, int64_t rotary_dim) {
  const char* op = "rope";
  check_defined(x, op, "x");
  check_defined(positions, op, "positions");
  CPF_CHECK(has_kernel(x.device(), &DeviceOps::rope), op, ": no kernel for device ", x.device(), " in this build");
  CPF_CHECK(is_floating(x.dtype()), op, ": x must be a floating tensor, got ", x.dtype());
  CPF_CHECK(x.dim() == 3 || x.dim() == 4, op, ": x must be (B, T, H, D) [bshd] or (T, H, D) [thd], got shape ",
            x.shape());
  CPF_CHECK(positions.device() == x.device(), op, ": positions are on ", positions.device(), " but x is on ",
            x.device());
  CPF_CHECK(positions.dtype() == DType::i32 || positions.dtype() == DType::i64, op,
            ": positions must be i32 or i64, got ", positions.dtype());
  RopeShape r;
  r.thd = x.dim() == 3;
  r.batch = r.thd ? 1 : x.size(0);
  r.seq = x.size(-3);
  r.heads = x.size(-2);
  r.dim = x.size(-1);
  r.per_batch = !r.thd && positions.shape() == Shape{r.batch, r.seq};
  if (r.thd) {
    CPF_CHECK(positions.shape() == Shape{r.seq}, op, ": positions must have shape [T]=[", r.seq, "] for x ", x.shape(),
              " (thd), got ", positions.shape());
  } else {
    CPF_CHECK(r.per_batch || positions.shape() == Shape{r.seq}, op, ": positions must have shape [T]=[", r.seq,
              "] or [B, T]=[", r.batch, ",", r.seq, "] for x ", x.shape(), " (bshd), got ", positions.shape());
  }
  r.rot = rotary_dim == -1 ? r.dim : rotary_dim;
  CPF_CHECK(r.rot > 0 && r.rot <= r.dim && r.rot % 2 == 0, op, ": rotary_dim must be even and in 1..D=", r.dim,
            ", got ", r.rot, rotary_dim == -1 ? " (rotary_dim=-1 means D)" : "", " for x ", x.shape());
  check_rope_frequencies(f, op);
  return r;
}

// The CPU kernel: angles in double, the rotation in A (f32 for f32/bf16, f64 for f64).
Tensor rope_cpu(const Tensor& x, const Tensor& positions, const RopeFrequencies& f, const RopeShape& r, bool inverse) {
  const int64_t half = r.rot / 2;
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) inv_freq[i] = f.of_pair(i, r.rot);
  const Tensor pos = contiguous(positions);
  const int64_t npos = pos.numel();
  const Tensor xs = x.stride(-1) == 1 ? x : contiguous(x);
  const int64_t sb = r.thd ? 0 : xs.stride(0), st = xs.stride(-3), sh = xs.stride(-2);
  const int64_t seq = r.seq, heads = r.heads, dim = r.dim, rot = r.rot;
  Tensor out = empty(x.shape(), {.dtype = x.dtype()});

  visit_storage(x.dtype(), [&]<class S, class A>() {
    // cos/sin per distinct position row, shared by every head (and by every batch for (T) positions).
    std::vector<A> cos_t(static_cast<size_t>(npos * half)), sin_t(static_cast<size_t>(npos * half));
    visit_position_type(pos.dtype(), [&]<class I>() {
      const I* p = pos.data<I>();
      const double sign = inverse ? -1.0 : 1.0;
#if defined(CPF_WITH_OPENMP)
#pragma omp parallel for if (npos * half >= cpu::kParallelGrain / 8) schedule(static)
#endif
      for (int64_t k = 0; k < npos; ++k) {
        const double position = static_cast<double>(p[k]);
        for (int64_t i = 0; i < half; ++i) {
          const double angle = position * inv_freq[i];
          cos_t[k * half + i] = static_cast<A>(std::cos(angle));
          sin_t[k * half + i] = static_cast<A>(sign * std::sin(angle));
        }
      }
    });
    const S* xb = xs.data<S>();
    S* ob = out.data<S>();
    const int64_t tokens = r.batch * seq;
#if defined(CPF_WITH_OPENMP)
#pragma omp parallel for if (tokens > 1 && out.numel() >= cpu::kParallelGrain) schedule(static)
#endif
    for (int64_t bt = 0; bt < tokens; ++bt) {
      const int64_t b = bt / seq, t = bt % seq;
      const int64_t row = r.per_batch ? bt : t;
      const A* c = cos_t.data() + row * half;
      const A* s = sin_t.data() + row * half;
      for (int64_t h = 0; h < heads; ++h) {
        const S* xi = xb + b * sb + t * st + h * sh;
        S* o = ob + (bt * heads + h) * dim;
        for (int64_t i = 0; i < half; ++i) {
          const A x1 = static_cast<A>(xi[i]);
          const A x2 = static_cast<A>(xi[i + half]);
          o[i] = static_cast<S>(x1 * c[i] - x2 * s[i]);
          o[i + half] = static_cast<S>(x2 * c[i] + x1 * s[i]);
        }
        for (int64_t i = rot; i < dim; ++i) o[i] = xi[i];
      }
    }
  });
  return out;
}

}  // namespace

Tensor rope(const Tensor& x, const Tensor& positions, double base, int64_t rotary_dim, bool inverse) {
  return rope(x, positions, RopeFrequencies{.base = base}, rotary_dim, inverse);
}

Tensor rope(const Tensor& x, const Tensor& positions, const RopeFrequencies& frequencies, int64_t rotary_dim,
            bool inverse) {
  const RopeShape r = check_rope_inputs(x, positions, frequencies, rotary_dim);
  if (x.device().is_cpu()) return rope_cpu(x, positions, frequencies, r, inverse);
  // x (B, T, H, D) or (T, H, D) with unit stride along D; positions contiguous (device_ops.h).
  Tensor out = empty(x.shape(), {.dtype = x.dtype(), .device = x.device()});
  device_kernel(x.device(), &DeviceOps::rope, "rope")(out, x.stride(-1) == 1 ? x : contiguous(x), contiguous(positions),
                                                      frequencies, r.rot, inverse);
  profile::add_work(0, 2 * profile::tensor_bytes(out));
  return out;
}

Tensor rope_backward(const Tensor& grad_y, const Tensor& positions, double base, int64_t rotary_dim, bool inverse) {
  return rope(grad_y, positions, base, rotary_dim, !inverse);
}

Tensor rope_backward(const Tensor& grad_y, const Tensor& positions, const RopeFrequencies& frequencies,
                     int64_t rotary_dim, bool inverse) {
  return rope(grad_y, positions, frequencies, rotary_dim, !inverse);
}

}  // namespace cpf::raw
