#include "framework/optim/lr_schedule.h"

#include <cmath>
#include <numbers>

#include "framework/core/error.h"

namespace cpf::optim {

const char* lr_decay_name(LrDecay decay) {
  switch (decay) {
    case LrDecay::cosine: return "cosine";
    case LrDecay::linear: return "linear";
    case LrDecay::constant: return "constant";
  }
  return "?";
}

LrDecay lr_decay_from_name(const std::string& name) {
  for (LrDecay d : {LrDecay::cosine, LrDecay::linear, LrDecay::constant}) {
    if (name == lr_decay_name(d)) return d;
  }
  CPF_FAIL("lr_schedule: unknown decay '", name, "' (expected cosine, linear or constant)");
}

void validate(const LrScheduleOptions& o) {
  CPF_CHECK(std::isfinite(o.lr) && o.lr >= 0, "lr_schedule: lr must be finite and >= 0, got ", o.lr);
  CPF_CHECK(o.warmup_steps >= 0, "lr_schedule: warmup_steps must be >= 0, got ", o.warmup_steps);
  if (o.decay == LrDecay::constant) return;
  CPF_CHECK(std::isfinite(o.min_lr) && o.min_lr >= 0, "lr_schedule: min_lr must be finite and >= 0, got ", o.min_lr);
  CPF_CHECK(o.min_lr <= o.lr, "lr_schedule: min_lr=", o.min_lr, " must not exceed the peak lr=", o.lr);
  CPF_CHECK(o.total_steps > 0, "lr_schedule: total_steps must be > 0 for ", lr_decay_name(o.decay), " decay, got ",
            o.total_steps);
  CPF_CHECK(o.warmup_steps <= o.total_steps, "lr_schedule: warmup_steps=", o.warmup_steps,
            " must not exceed total_steps=", o.total_steps);
}

LrSchedule::LrSchedule(const LrScheduleOptions& options) : options_(options) { validate(options_); }

double LrSchedule::lr_at(int64_t step) const {
  CPF_CHECK(step >= 0, "lr_schedule: step must be >= 0, got ", step);
  const LrScheduleOptions& o = options_;
  if (step < o.warmup_steps) {
    return o.lr * static_cast<double>(step + 1) / static_cast<double>(o.warmup_steps);
  }
  if (o.decay == LrDecay::constant) return o.lr;
  if (step >= o.total_steps) return o.min_lr;
  // total_steps > warmup_steps here: step lies in [warmup_steps, total_steps).
  const double progress =
      static_cast<double>(step - o.warmup_steps) / static_cast<double>(o.total_steps - o.warmup_steps);
  if (o.decay == LrDecay::linear) return o.lr - (o.lr - o.min_lr) * progress;
  return o.min_lr + 0.5 * (o.lr - o.min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
}

}  // namespace cpf::optim
