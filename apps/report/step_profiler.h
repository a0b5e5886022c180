#pragma once
// The trainer's profiler (run.profile: N, or --profile N): records profile::Scope times
// (framework/tensor/profile.h) over N steps after the first (which builds plans and fills caches), then
// prints a per-step table and writes it to <run folder>/profile.txt.
//
// What it measures: the step, its phases (forward, backward, optimizer: scopes the trainer opens),
// the forward of each module kind (forward/linear, forward/attention, ...) and the backward of each
// autograd op (backward/<op>). GPU time comes from CUDA events on the rank's stream, so it needs no
// synchronisation inside the step (it is read once, after the window); host time is the CPU's time in the same scopes
// (on a CPU run, the work itself). Nested rows include their children: the phases add up to the step, the op rows do
// not add up to their phase (element-wise glue between modules is in the phase only).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "framework/tensor/device.h"
#include "framework/tensor/profile.h"

namespace cpf::trainer {

// One row of the per-step table.
struct ProfileRow {
  std::string name;
  double calls_per_step = 0;
  double gpu_ms_per_step = -1;  // -1: no GPU time (a CPU run)
  double host_ms_per_step = 0;
  double share = 0;  // of the step's time (GPU when measured, else host)
  // Achieved rates of the work the ops inside reported (profile::add_work) over the scope's time (GPU
  // when measured, else host); 0 when none was reported.
  double tflops = 0, gbps = 0;
};

// Rows per step from a table of `steps` steps, sorted phases first (in step order), then ops by time.
std::vector<ProfileRow> per_step_rows(const std::vector<profile::Stats>& stats, int64_t steps);
// The text table, with a header line naming the steps and the device.
std::string format_profile(const std::vector<ProfileRow>& rows, int64_t first_step, int64_t steps,
                           const std::string& device);

class StepProfiler {
 public:
  // steps = 0: off. Profiles steps first_step + 2 .. first_step + 1 + steps: first_step is the step the
  // run starts after (0, or the resumed checkpoint's), and its first step is left out. Throws when the
  // window ends after last_step (the run's run.steps).
  StepProfiler(int64_t steps, int64_t first_step, int64_t last_step, Device device, std::string out_path);
  bool active(int64_t step) const;
  bool starts_window(int64_t step) const { return steps_ > 0 && step == first_ + 2; }
  bool ends_window(int64_t step) const { return steps_ > 0 && step == window_end(); }
  // Call before and after each step: recording goes on before the window's first step and off after
  // its last, which returns the table (also written to out_path); nullopt otherwise. With several
  // ranks in the process, all of them must be between steps at both points (the trainer holds a
  // barrier there), so every rank's scopes of the window's steps are recorded, and only those.
  void begin_step(int64_t step);
  std::optional<std::string> end_step(int64_t step);
  int64_t window_end() const { return first_ + 1 + steps_; }

 private:
  int64_t steps_;
  int64_t first_;
  Device device_;
  std::string out_path_;
};

}  // namespace cpf::trainer
