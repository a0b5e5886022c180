#include "framework/autograd/fp8_autocast.h"

#include <utility>

#include "framework/autograd/grad_mode.h"

namespace cpf {
namespace {

thread_local std::optional<Fp8Autocast::Scope> active;

}  // namespace

Fp8Autocast::Fp8Autocast(bool enabled, Fp8LinearOptions options, Fp8ScalingState* state, std::string prefix)
    : previous_(active), enabled_(enabled) {
  if (!enabled_) return;
  if (state != nullptr) options.margin = state->options().margin;
  active = Scope{.options = std::move(options), .state = state, .prefix = std::move(prefix), .next = 0};
}

Fp8Autocast::~Fp8Autocast() {
  if (enabled_) active = previous_;
}

bool fp8_autocast_active() { return active.has_value(); }

std::optional<Fp8LinearOptions> next_fp8_linear_options() {
  if (!active) return std::nullopt;
  Fp8LinearOptions options = active->options;
  const int64_t index = active->next++;
  if (active->state != nullptr) {
    const std::string key = (active->prefix.empty() ? "" : active->prefix + ".") + "fp8_" + std::to_string(index);
    options.slot = active->state->slot(key);
    // Only training records amaxes: an evaluation between steps must not move the scales.
    if (!grad_enabled()) options.slot->amax = {};
  }
  return options;
}

bool use_fp8_linear(const Tensor& x, int64_t out_features) {
  return use_fp8_linear(x, x.defined() && x.dim() >= 1 ? x.size(-1) : 0, out_features);
}

bool fp8_fuse_activation_casts() { return active.has_value() && active->options.fuse_activation_casts; }

bool use_fp8_linear(const Tensor& x, int64_t in_features, int64_t out_features) {
  if (!active || !x.defined() || x.dtype() != DType::bf16 || x.dim() < 1) return false;
  const int64_t width = x.size(-1);
  const int64_t rows = width > 0 ? x.numel() / width : 0;
  return rows > 0 && rows % 16 == 0 && in_features > 0 && in_features % 16 == 0 && out_features > 0 &&
         out_features % 16 == 0;
}

}  // namespace cpf
