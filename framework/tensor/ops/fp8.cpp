#include "framework/tensor/ops/fp8.h"

#include <Eigen/Core>
#include <cmath>
#include <limits>
#include <vector>

#include "framework/tensor/bfloat16.h"
#include "framework/tensor/device_ops.h"
#include "framework/tensor/float8.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/reduce.h"
#include "framework/tensor/ops/views.h"
#include "framework/tensor/shape_utils.h"

namespace cpf::raw {

namespace {

void check_fp8_dtype(DType dtype, const char* op, const char* what) {
  CPF_CHECK(is_fp8(dtype), op, ": ", what, " must be f8e4m3 or f8e5m2, got ", dtype_name(dtype));
}

// A () or (1) f32 tensor on `device`: a scale, inverse scale or amax.
void check_scalar(const Tensor& t, Device device, const char* op, const char* what) {
  CPF_CHECK(t.defined(), op, ": ", what, " is undefined (a () f32 tensor on ", device, ")");
  CPF_CHECK(t.numel() == 1 && t.dim() <= 1 && t.dtype() == DType::f32, op, ": ", what,
            " must be a () f32 tensor, got shape ", t.shape(), " dtype ", dtype_name(t.dtype()));
  CPF_CHECK(t.device() == device, op, ": ", what, " is on ", t.device(), " but the data is on ", device);
}

float scalar_value(const Tensor& t) { return *static_cast<const float*>(t.raw_data()); }

// Calls fn(decode) with decode(i) the float value of q's element i (q contiguous on the CPU).
template <class Fn>
void with_fp8_values(const Tensor& q, Fn&& fn) {
  const auto* bits = static_cast<const uint8_t*>(q.raw_data());
  if (q.dtype() == DType::f8e4m3) {
    fn([bits](int64_t i) { return static_cast<float>(float8_e4m3::from_bits(bits[i])); });
  } else {
    fn([bits](int64_t i) { return static_cast<float>(float8_e5m2::from_bits(bits[i])); });
  }
}

// Element i of a contiguous f32 / bf16 / f64 CPU tensor as a float (f64 rounded once).
template <class Fn>
void with_float_values(const Tensor& x, Fn&& fn) {
  if (x.dtype() == DType::f32) {
    const auto* p = static_cast<const float*>(x.raw_data());
    fn([p](int64_t i) { return p[i]; });
  } else if (x.dtype() == DType::bf16) {
    const auto* p = static_cast<const bfloat16*>(x.raw_data());
    fn([p](int64_t i) { return static_cast<float>(p[i]); });
  } else {
    const auto* p = static_cast<const double*>(x.raw_data());
    fn([p](int64_t i) { return static_cast<float>(p[i]); });
  }
}

float cpu_amax(const Tensor& x) {
  float m = 0.0f;
  with_float_values(x, [&](auto value) {
    for (int64_t i = 0; i < x.numel(); ++i) {
      const float a = std::fabs(value(i));
      if (std::isnan(a)) {
        m = a;
        return;
      }
      m = std::max(m, a);
    }
  });
  return m;
}

void cpu_quantize(const Tensor& q, const Tensor& x, float scale) {
  auto* out = static_cast<uint8_t*>(q.raw_data());
  const bool e4m3 = q.dtype() == DType::f8e4m3;
  with_float_values(x, [&](auto value) {
    for (int64_t i = 0; i < x.numel(); ++i) {
      const float v = value(i) * scale;  // one f32 product, as the CUDA kernel computes it
      out[i] = e4m3 ? float8_e4m3(v).bits : float8_e5m2(v).bits;
    }
  });
}

// The decoded values of an FP8 matrix (rows, cols), exact in f64.
Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> decoded(const Tensor& q) {
  Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> m(q.size(0), q.size(1));
  with_fp8_values(q, [&](auto value) {
    for (int64_t i = 0; i < q.numel(); ++i) m.data()[i] = value(i);
  });
  return m;
}

// The products of FP8 values are exact in f64 (and in f32), the sums are taken in f64 (Eigen's GEMM),
// the scales and the bias applied once, then one rounding to f32.
void cpu_matmul_nt(const Tensor& out, const Tensor& a, float sa, const Tensor& b, float sb, const Tensor& bias) {
  const int64_t m = a.size(0), n = b.size(0);
  Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> acc = decoded(a) * decoded(b).transpose();
  const Tensor bias_f = bias.defined() ? raw::to(bias, DType::f32) : Tensor();
  const float* bias_p = bias_f.defined() ? static_cast<const float*>(bias_f.raw_data()) : nullptr;
  const double scale = static_cast<double>(sa) * static_cast<double>(sb);
  std::vector<float> result(m * n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      result[i * n + j] = static_cast<float>(acc(i, j) * scale + (bias_p ? bias_p[j] : 0.0f));
    }
  }
  copy_(out, from_vector(result, {m, n}));
}

void check_quantize_args(const Tensor& x, const Tensor& scale, DType fp8, const Tensor& amax_out, const char* op) {
  check_defined(x, op, "x");
  check_fp8_dtype(fp8, op, "the target dtype");
  CPF_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::bf16, op, ": x must be f32 or bf16, got ",
            dtype_name(x.dtype()));
  check_scalar(scale, x.device(), op, "scale");
  if (amax_out.defined()) check_scalar(amax_out, x.device(), op, "amax_out");
}

// amax_out = max(amax_out, max |x|), NaN when either is (x contiguous on the CPU; amax_out may be undefined).
void fold_cpu_amax(const Tensor& amax_out, const Tensor& x) {
  if (!amax_out.defined()) return;
  float& m = *static_cast<float*>(amax_out.raw_data());
  const float a = cpu_amax(x);
  m = (std::isnan(a) || std::isnan(m)) ? std::numeric_limits<float>::quiet_NaN() : std::max(m, a);
}

}  // namespace

double fp8_max(DType fp8) {
  check_fp8_dtype(fp8, "fp8_max", "the dtype");
  return fp8 == DType::f8e4m3 ? float8_e4m3::kMax : float8_e5m2::kMax;
}

Tensor abs_max(const Tensor& x) {
  check_defined(x, "abs_max", "x");
  CPF_CHECK(is_floating(x.dtype()), "abs_max: x must be f32, bf16 or f64, got ", dtype_name(x.dtype()));
  Tensor out = zeros({}, {.dtype = DType::f32, .device = x.device()});
  if (x.numel() == 0) return out;
  const Tensor xc = contiguous(x);
  if (x.device().is_cpu()) {
    *static_cast<float*>(out.raw_data()) = cpu_amax(xc);
  } else {
    device_kernel(x.device(), &DeviceOps::fp8_amax, "abs_max")(out, xc);
  }
  return out;
}

Tensor fp8_scale(const Tensor& amax_value, DType fp8, int64_t margin, const Tensor& fallback) {
  const double max = fp8_max(fp8);
  check_scalar(amax_value, amax_value.defined() ? amax_value.device() : Device::cpu(), "fp8_scale", "amax");
  CPF_CHECK(margin >= 0 && margin <= 64, "fp8_scale: margin must be in [0, 64], got ", margin);
  if (fallback.defined()) check_scalar(fallback, amax_value.device(), "fp8_scale", "fallback");
  Tensor out = empty({}, {.dtype = DType::f32, .device = amax_value.device()});
  if (amax_value.device().is_cpu()) {
    const float a = scalar_value(amax_value);
    const bool usable = std::isfinite(a) && a > 0.0f;
    const float scale = usable ? static_cast<float>(max / static_cast<double>(a) / std::ldexp(1.0, margin))
                               : (fallback.defined() ? scalar_value(fallback) : 1.0f);
    *static_cast<float*>(out.raw_data()) = scale;
  } else {
    device_kernel(out.device(), &DeviceOps::fp8_scale, "fp8_scale")(out, amax_value, max, margin, fallback);
  }
  return out;
}

Tensor quantize_fp8(const Tensor& x, const Tensor& scale, DType fp8, const Tensor& amax_out) {
  check_quantize_args(x, scale, fp8, amax_out, "quantize_fp8");
  Tensor q = empty(x.shape(), {.dtype = fp8, .device = x.device()});
  if (x.numel() == 0) return q;
  const Tensor xc = contiguous(x);
  if (x.device().is_cpu()) {
    cpu_quantize(q, xc, scalar_value(scale));
    fold_cpu_amax(amax_out, xc);
  } else {
    device_kernel(x.device(), &DeviceOps::quantize_fp8, "quantize_fp8")(q, Tensor(), xc, scale, amax_out, Tensor());
  }
  return q;
}

Fp8Transposed quantize_fp8_transposed(const Tensor& x, const Tensor& scale, DType fp8, const Tensor& amax_out,
                                      bool with_plain, bool with_column_sums) {
  check_quantize_args(x, scale, fp8, amax_out, "quantize_fp8_transposed");
  CPF_CHECK(x.dim() == 2, "quantize_fp8_transposed: x must be 2-D (R, C), got ", x.shape());
  Fp8Transposed out;
  out.qt = empty({x.size(1), x.size(0)}, {.dtype = fp8, .device = x.device()});
  if (with_plain) out.q = empty(x.shape(), {.dtype = fp8, .device = x.device()});
  if (with_column_sums) out.column_sums = zeros({x.size(1)}, {.dtype = DType::f32, .device = x.device()});
  if (x.numel() == 0) return out;
  const Tensor xc = contiguous(x);
  if (x.device().is_cpu()) {
    const Tensor q = with_plain ? out.q : empty(x.shape(), {.dtype = fp8});
    cpu_quantize(q, xc, scalar_value(scale));
    copy_(out.qt, transpose(q, 0, 1));  // the same codes, moved as bytes
    fold_cpu_amax(amax_out, xc);
    if (with_column_sums) copy_(out.column_sums, sum(to(xc, DType::f64), {0}));
  } else {
    device_kernel(x.device(), &DeviceOps::quantize_fp8, "quantize_fp8_transposed")(out.q, out.qt, xc, scale, amax_out,
                                                                                   out.column_sums);
  }
  return out;
}

Tensor dequantize_fp8(const Tensor& q, const Tensor& scale_inv, DType out_dtype) {
  check_defined(q, "dequantize_fp8", "q");
  check_fp8_dtype(q.dtype(), "dequantize_fp8", "q");
  CPF_CHECK(out_dtype == DType::f32 || out_dtype == DType::bf16, "dequantize_fp8: the output dtype must be f32 or ",
            "bf16, got ", dtype_name(out_dtype));
  check_scalar(scale_inv, q.device(), "dequantize_fp8", "scale_inv");
  CPF_CHECK(q.is_contiguous(), "dequantize_fp8: q must be contiguous, got strides ", q.strides());
  Tensor out = empty(q.shape(), {.dtype = out_dtype, .device = q.device()});
  if (q.numel() == 0) return out;
  if (!q.device().is_cpu()) {
    device_kernel(q.device(), &DeviceOps::dequantize_fp8, "dequantize_fp8")(out, q, scale_inv);
    return out;
  }
  const float s = scalar_value(scale_inv);
  std::vector<float> values(q.numel());
  with_fp8_values(q, [&](auto value) {
    for (int64_t i = 0; i < q.numel(); ++i) values[i] = value(i) * s;
  });
  copy_(out, from_vector(values, q.shape()));
  return out;
}

Tensor fp8_matmul_nt(const Tensor& a, const Tensor& a_scale_inv, const Tensor& b, const Tensor& b_scale_inv,
                     DType out_dtype, const Tensor& bias, bool fast_accumulation) {
  constexpr const char* kOp = "fp8_matmul_nt";
  check_defined(a, kOp, "a");
  check_defined(b, kOp, "b");
  check_fp8_dtype(a.dtype(), kOp, "a");
  check_fp8_dtype(b.dtype(), kOp, "b");
  CPF_CHECK(!(a.dtype() == DType::f8e5m2 && b.dtype() == DType::f8e5m2), kOp,
            ": a and b are both f8e5m2 (the FP8 GEMM takes at most one E5M2 operand; gradients are E5M2, ",
            "weights and activations E4M3)");
  CPF_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(1), kOp, ": a (M, K) and b (N, K) must share K, got ",
            a.shape(), " and ", b.shape());
  CPF_CHECK(a.is_contiguous() && b.is_contiguous(), kOp, ": a and b must be contiguous (K-major), got strides ",
            a.strides(), " and ", b.strides());
  CPF_CHECK(a.size(1) > 0, kOp, ": K is 0 (nothing to multiply)");
  CPF_CHECK(a.device() == b.device(), kOp, ": a is on ", a.device(), " but b on ", b.device());
  check_scalar(a_scale_inv, a.device(), kOp, "a_scale_inv");
  check_scalar(b_scale_inv, a.device(), kOp, "b_scale_inv");
  CPF_CHECK(out_dtype == DType::bf16 || out_dtype == DType::f32, kOp, ": the output dtype must be bf16 or f32, got ",
            dtype_name(out_dtype));
  if (bias.defined()) {
    CPF_CHECK(bias.dim() == 1 && bias.size(0) == b.size(0) && bias.dtype() == out_dtype && bias.is_contiguous() &&
                  bias.device() == a.device(),
              kOp, ": bias must be a contiguous (", b.size(0), ") ", dtype_name(out_dtype), " tensor on ", a.device(),
              ", got shape ", bias.shape(), " dtype ", dtype_name(bias.dtype()), " on ", bias.device());
  }
  Tensor out = empty({a.size(0), b.size(0)}, {.dtype = out_dtype, .device = a.device()});
  if (out.numel() == 0) return out;
  if (a.device().is_cpu()) {
    cpu_matmul_nt(out, a, scalar_value(a_scale_inv), b, scalar_value(b_scale_inv), bias);
  } else {
    device_kernel(a.device(), &DeviceOps::fp8_matmul_nt, kOp)(out, a, a_scale_inv, b, b_scale_inv, bias,
                                                              fast_accumulation);
  }
  return out;
}

}  // namespace cpf::raw
