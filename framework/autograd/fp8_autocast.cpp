#include "framework/autograd/fp8_autocast.h"

namespace cpf {
namespace {

thread_local std::optional<Fp8LinearOptions> active;

}  // namespace

Fp8Autocast::Fp8Autocast(bool enabled, Fp8LinearOptions options) : previous_(active), enabled_(enabled) {
  if (enabled_) active = options;
}

Fp8Autocast::~Fp8Autocast() {
  if (enabled_) active = previous_;
}

std::optional<Fp8LinearOptions> fp8_autocast_options() { return active; }

bool use_fp8_linear(const Tensor& x, int64_t out_features) {
  if (!active || !x.defined() || x.dtype() != DType::bf16 || x.dim() < 1) return false;
  const int64_t k = x.size(-1);
  const int64_t rows = k > 0 ? x.numel() / k : 0;
  return rows > 0 && rows % 16 == 0 && k % 16 == 0 && out_features > 0 && out_features % 16 == 0;
}

}  // namespace cpf
