#pragma once
// Learning-rate schedules: linear warmup to the peak, then cosine or linear decay to a floor, or
// constant. `step` is the 0-based index of the optimizer step about to be taken:
//
//   s < warmup_steps:            lr = peak * (s + 1) / warmup_steps      (never 0 on the first step)
//   decay, warmup <= s < total:  p = (s - warmup_steps) / (total_steps - warmup_steps)     in [0, 1)
//                                cosine: lr = min_lr + (peak - min_lr) * (1 + cos(pi * p)) / 2
//                                linear: lr = peak - (peak - min_lr) * p
//   decay, s >= total_steps:     lr = min_lr
//   constant, s >= warmup_steps: lr = peak
//
// Typical loop: `optimizer.set_lr(schedule.lr_at(optimizer.step_count())); optimizer.step();`.
#include <cstdint>
#include <string>

namespace cpf::optim {

enum class LrDecay { cosine, linear, constant };

const char* lr_decay_name(LrDecay decay);
// "cosine" | "linear" | "constant"; throws listing the accepted names.
LrDecay lr_decay_from_name(const std::string& name);

// Fields are the YAML keys of the `lr_schedule:` section (docs/optim.md).
struct LrScheduleOptions {
  LrDecay decay = LrDecay::cosine;
  double lr = 6e-4;          // peak, reached at the end of warmup; finite, >= 0
  double min_lr = 6e-5;      // floor reached at total_steps; in [0, lr] (unused by constant)
  int64_t warmup_steps = 0;  // >= 0; <= total_steps when decaying
  int64_t total_steps = 0;   // > 0 when decaying (steps of the whole run); ignored by constant
};

// Throws naming the first invalid field or combination.
void validate(const LrScheduleOptions& options);

class LrSchedule {
 public:
  explicit LrSchedule(const LrScheduleOptions& options);
  // The learning rate for 0-based step `step` (>= 0).
  double lr_at(int64_t step) const;
  const LrScheduleOptions& options() const { return options_; }

 private:
  LrScheduleOptions options_;
};

}  // namespace cpf::optim
