#include "framework/tensor/random.h"

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

}  // namespace

Tensor uniform(const Shape& shape, double low, double high, TensorOptions options, Generator* gen) {
  CPF_CHECK(low <= high, "uniform: low=", low, " must not exceed high=", high);
  return draw(shape, options, gen, [=](const PhiloxBlock& b) { return low + (high - low) * uniform_double(b); });
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
