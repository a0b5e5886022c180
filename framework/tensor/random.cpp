#include "framework/tensor/random.h"

#include <cmath>
#include <limits>

#include "framework/core/philox.h"
#include "framework/tensor/ops/copy.h"

namespace cpf {
namespace {

// Fills a host f64 buffer with value(block) for elements [offset, offset + n), then converts.
template <class F>
Tensor draw(const Shape& shape, TensorOptions options, Generator* gen, F&& value) {
  Generator& g = gen ? *gen : default_generator();
  Tensor host = empty(shape, {.dtype = DType::f64});
  const int64_t n = host.numel();
  const uint64_t first = g.reserve(static_cast<uint64_t>(n));
  const uint64_t seed = g.seed();
  double* out = host.data<double>();
#if defined(CPF_WITH_OPENMP)
#pragma omp parallel for if (n > (1 << 16)) schedule(static)
#endif
  for (int64_t i = 0; i < n; ++i) out[i] = value(philox_block(seed, first + static_cast<uint64_t>(i)));
  Tensor result = raw::to(raw::to(host, options.dtype), options.device);
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
  if (low == high) return draw(shape, options, gen, [=](const PhiloxBlock&) { return low; });
  const DType dtype = options.dtype;
  return draw(shape, options, gen, [=](const PhiloxBlock& b) {
    return below_high(low + (high - low) * uniform_double(b), high, dtype);
  });
}

Tensor rand(const Shape& shape, TensorOptions options, Generator* gen) { return uniform(shape, 0.0, 1.0, options, gen); }

Tensor normal(const Shape& shape, double mean, double stddev, TensorOptions options, Generator* gen) {
  CPF_CHECK(stddev >= 0, "normal: stddev=", stddev, " must be non-negative");
  return draw(shape, options, gen, [=](const PhiloxBlock& b) { return mean + stddev * normal_double(b); });
}

Tensor randn(const Shape& shape, TensorOptions options, Generator* gen) { return normal(shape, 0.0, 1.0, options, gen); }

Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions options, Generator* gen) {
  CPF_CHECK(low < high, "randint: empty range [", low, ", ", high, ")");
  const double span = static_cast<double>(high - low);
  return draw(shape, options, gen, [=](const PhiloxBlock& b) {
    const uint64_t bits = (static_cast<uint64_t>(b[0]) << 32) | b[1];
    return static_cast<double>(low + static_cast<int64_t>(bits % static_cast<uint64_t>(span)));
  });
}

}  // namespace cpf
