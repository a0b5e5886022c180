#include "framework/tensor/cpu/transcendental.h"

#include <algorithm>
#include <cmath>

#include "framework/tensor/cpu/softmax_kernels.h"
#include "framework/tensor/cpu/strided_loop.h"

namespace cpf::cpu {
namespace {

constexpr int64_t kBlock = 1024;  // elements per pass: the temporaries stay in L1

// The logistic function of t, given e = exp(-|t|).
inline float logistic(float t, float e) { return (t >= 0.0f ? 1.0f : e) / (1.0f + e); }

// One block of at most kBlock elements.
void run_block(FastUnary op, const float* x, float* out, int64_t n) {
  if (op == FastUnary::exp) {
    exp_sum(x, 0.0f, out, n);
    return;
  }
  float arg[kBlock];  // the logistic's argument t
  float e[kBlock];    // exp(-|t|)
  constexpr float kSqrt2OverPi = 0.7978845608028654f, kGeluCoeff = 0.044715f;
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    // gelu(x) = 0.5 x (1 + tanh(z)) = x * logistic(2 z), z = sqrt(2/pi) (x + 0.044715 x^3)
    arg[i] = op == FastUnary::gelu ? 2.0f * kSqrt2OverPi * (v + kGeluCoeff * v * v * v) : v;
    e[i] = -std::fabs(arg[i]);
  }
  exp_sum(e, 0.0f, e, n);
  if (op == FastUnary::sigmoid) {
    for (int64_t i = 0; i < n; ++i) out[i] = logistic(arg[i], e[i]);
  } else {  // silu and gelu: x * logistic(t)
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * logistic(arg[i], e[i]);
  }
}

}  // namespace

void fast_unary_f32(FastUnary op, const float* x, float* out, int64_t n) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#if defined(CPF_WITH_OPENMP)
#pragma omp parallel for if (n >= kParallelGrain && max_threads() > 1) schedule(static)
#endif
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t first = b * kBlock;
    run_block(op, x + first, out + first, std::min(kBlock, n - first));
  }
}

}  // namespace cpf::cpu
