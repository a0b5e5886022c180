#include "framework/tensor/random.h"

#include <cmath>
#include <limits>

#include "framework/core/philox.h"
#include "framework/tensor/device_ops.h"
#include "framework/tensor/ops/copy.h"

namespace cpf {
namespace {

// Element i of the draw is value(philox_block(seed, first + i)) in f64, then converted to the dtype.
// On a device with a philox kernel the f64 values are generated there (the kernel computes the same
// doubles: device.op describes `value`); otherwise on the host and copied over.
template <class F>
Tensor draw(const Shape& shape, TensorOptions options, Generator* gen, DeviceRandom device, F&& value) {
  Generator& g = gen ? *gen : default_generator();
  const int64_t n = shape_numel(shape);
  const uint64_t first = g.reserve(static_cast<uint64_t>(n));
  const uint64_t seed = g.seed();
  Tensor result;
  if (!options.device.is_cpu() && has_kernel(options.device, &DeviceOps::philox)) {
    Tensor wide = empty(shape, {.dtype = DType::f64, .device = options.device});
    device.seed = seed;
    device.first = first;
    device.dtype = options.dtype;
    if (n > 0) device_kernel(options.device, &DeviceOps::philox, "random")(device, wide);
    result = options.dtype == DType::f64 ? wide : raw::to(wide, options.dtype);
  } else {
    Tensor host = empty(shape, {.dtype = DType::f64});
    double* out = host.data<double>();
#if defined(CPF_WITH_OPENMP)
#pragma omp parallel for if (n > (1 << 16)) schedule(static)
#endif
    for (int64_t i = 0; i < n; ++i) out[i] = value(philox_block(seed, first + static_cast<uint64_t>(i)));
    result = raw::to(raw::to(host, options.dtype), options.device);
  }
  if (options.requires_grad) result.set_requires_grad(true);
  return result;
}

// `v` < high rounds to `dtype` when stored; when that rounding lands on high (excluded), returns the
// next representable value below instead. Only f32 and bf16 can round up that far.
double below_high(double v, double high, DType dtype) {
  if (dtype == DType::f32) {
    const float f = static_cast<float>(v);
    return f < high ? f : std::nextafter(f, -std::numeric_limits<float>::infinity());
  }
  if (dtype == DType::bf16) {
    bfloat16 b(static_cast<float>(v));
    if (static_cast<float>(b) < high) return static_cast<float>(b);
    // One bf16 step towards -inf: magnitude down for positive values, up for negative ones.
    if (b.bits == 0x0000) return static_cast<float>(bfloat16::from_bits(0x8001));
    b.bits = (b.bits & 0x8000) ? static_cast<uint16_t>(b.bits + 1) : static_cast<uint16_t>(b.bits - 1);
    return static_cast<float>(b);
  }
  return v;
}

}  // namespace

Tensor uniform(const Shape& shape, double low, double high, TensorOptions options, Generator* gen) {
  CPF_CHECK(low <= high, "uniform: low=", low, " must not exceed high=", high);
  if (low == high) {
    return draw(shape, options, gen, {.op = DeviceRandomOp::uniform, .a = low, .b = low},
                [=](const PhiloxBlock&) { return low; });
  }
  const DType dtype = options.dtype;
  return draw(shape, options, gen, {.op = DeviceRandomOp::uniform, .a = low, .b = high},
              [=](const PhiloxBlock& b) { return below_high(low + (high - low) * uniform_double(b), high, dtype); });
}

Tensor rand(const Shape& shape, TensorOptions options, Generator* gen) {
  return uniform(shape, 0.0, 1.0, options, gen);
}

Tensor normal(const Shape& shape, double mean, double stddev, TensorOptions options, Generator* gen) {
  CPF_CHECK(stddev >= 0, "normal: stddev=", stddev, " must be non-negative");
  return draw(shape, options, gen, {.op = DeviceRandomOp::normal, .a = mean, .b = stddev},
              [=](const PhiloxBlock& b) { return mean + stddev * normal_double(b); });
}

Tensor randn(const Shape& shape, TensorOptions options, Generator* gen) {
  return normal(shape, 0.0, 1.0, options, gen);
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions options, Generator* gen) {
  CPF_CHECK(low < high, "randint: empty range [", low, ", ", high, ")");
  const double span = static_cast<double>(high - low);
  const uint64_t span_bits = static_cast<uint64_t>(span);
  return draw(shape, options, gen, {.op = DeviceRandomOp::randint, .low = low, .span = span_bits},
              [=](const PhiloxBlock& b) {
                const uint64_t bits = (static_cast<uint64_t>(b[0]) << 32) | b[1];
                return static_cast<double>(low + static_cast<int64_t>(bits % span_bits));
              });
}

}  // namespace cpf
