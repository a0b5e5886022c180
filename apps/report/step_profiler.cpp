#include "apps/report/step_profiler.h"

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "framework/core/error.h"

namespace cpf::trainer {
namespace {

// The scopes the trainer opens around a step and its phases, in step order.
constexpr const char* kPhases[] = {"step",           "phase/data",      "phase/forward",
                                   "phase/backward", "phase/grad_sync", "phase/optimizer"};

int phase_rank(const std::string& name) {
  for (int i = 0; i < static_cast<int>(std::size(kPhases)); ++i) {
    if (name == kPhases[i]) return i;
  }
  return -1;
}

}  // namespace

std::vector<ProfileRow> per_step_rows(const std::vector<profile::Stats>& stats, int64_t steps) {
  CPF_CHECK(steps >= 1, "profile: the table needs at least one step, got ", steps);
  const auto n = static_cast<double>(steps);
  double step_gpu = 0, step_host = 0;
  for (const profile::Stats& s : stats) {
    if (s.name == "step") {
      step_gpu = s.gpu_calls > 0 ? s.gpu_total_ms / n : 0;
      step_host = s.host_total_ms / n;
    }
  }
  std::vector<ProfileRow> rows;
  for (const profile::Stats& s : stats) {
    ProfileRow r;
    r.name = s.name;
    r.calls_per_step = static_cast<double>(s.calls) / n;
    r.host_ms_per_step = s.host_total_ms / n;
    r.gpu_ms_per_step = s.gpu_calls > 0 ? s.gpu_total_ms / n : -1;
    const bool gpu = r.gpu_ms_per_step >= 0 && step_gpu > 0;
    const double total = gpu ? step_gpu : step_host;
    r.share = total > 0 ? (gpu ? r.gpu_ms_per_step : r.host_ms_per_step) / total : 0;
    // Achieved rates over the scope's GPU time (its host time where there is none): what the ops inside
    // reported (profile::add_work).
    const double ms = r.gpu_ms_per_step >= 0 ? r.gpu_ms_per_step : r.host_ms_per_step;
    if (ms > 0 && s.flops > 0) r.tflops = s.flops / n / (ms * 1e9);
    if (ms > 0 && s.bytes > 0) r.gbps = s.bytes / n / (ms * 1e6);
    rows.push_back(r);
  }
  std::stable_sort(rows.begin(), rows.end(), [](const ProfileRow& a, const ProfileRow& b) {
    const int pa = phase_rank(a.name), pb = phase_rank(b.name);
    if ((pa >= 0) != (pb >= 0)) return pa >= 0;
    if (pa >= 0) return pa < pb;
    const double ta = a.gpu_ms_per_step >= 0 ? a.gpu_ms_per_step : a.host_ms_per_step;
    const double tb = b.gpu_ms_per_step >= 0 ? b.gpu_ms_per_step : b.host_ms_per_step;
    return ta > tb;
  });
  return rows;
}

std::string format_profile(const std::vector<ProfileRow>& rows, int64_t first_step, int64_t steps,
                           const std::string& device) {
  size_t width = 16;
  for (const ProfileRow& r : rows) width = std::max(width, r.name.size());
  std::string out = "profile: steps " + std::to_string(first_step + 1) + "-" + std::to_string(first_step + steps) +
                    " on " + device + ", per step (" +
                    (device.rfind("cpu", 0) == 0 ? std::string("no GPU: host wall time only")
                                                 : std::string("GPU time from CUDA events")) +
                    "; nested rows include their children)\n";
  char line[512];
  std::snprintf(line, sizeof line, "%-*s %10s %12s %8s %12s %9s %9s\n", static_cast<int>(width), "scope", "calls",
                "GPU ms", "share", "host ms", "TFLOP/s", "GB/s");
  out += line;
  for (const ProfileRow& r : rows) {
    char gpu[32] = "-", tflops[32] = "-", gbps[32] = "-";
    if (r.gpu_ms_per_step >= 0) std::snprintf(gpu, sizeof gpu, "%.3f", r.gpu_ms_per_step);
    if (r.tflops > 0) std::snprintf(tflops, sizeof tflops, "%.3g", r.tflops);
    if (r.gbps > 0) std::snprintf(gbps, sizeof gbps, "%.3g", r.gbps);
    std::snprintf(line, sizeof line, "%-*s %10.1f %12s %7.1f%% %12.3f %9s %9s\n", static_cast<int>(width),
                  r.name.c_str(), r.calls_per_step, gpu, 100.0 * r.share, r.host_ms_per_step, tflops, gbps);
    out += line;
  }
  return out;
}

StepProfiler::StepProfiler(int64_t steps, int64_t first_step, int64_t last_step, Device device, std::string out_path)
    : steps_(steps), first_(first_step), device_(device), out_path_(std::move(out_path)) {
  CPF_CHECK(steps >= 0, "run.profile=", steps, " must be 0 (off) or a number of steps to profile");
  CPF_CHECK(steps == 0 || window_end() <= last_step, "run.profile=", steps, " profiles steps ", first_step + 2, "-",
            window_end(), " (the run's first step is left out) but the run ends at step ", last_step,
            ": lower run.profile to at most ", std::max<int64_t>(last_step - first_step - 1, 0), " or raise run.steps");
}

bool StepProfiler::active(int64_t step) const { return steps_ > 0 && step > first_ + 1 && step <= window_end(); }

void StepProfiler::begin_step(int64_t step) {
  if (!starts_window(step)) return;
  profile::reset();
  profile::set_enabled(true);
}

std::optional<std::string> StepProfiler::end_step(int64_t step) {
  if (!ends_window(step)) return std::nullopt;
  profile::set_enabled(false);
  const std::string table =
      format_profile(per_step_rows(profile::snapshot(), steps_), first_ + 1, steps_, device_.str());
  std::ofstream file(out_path_);
  file << table;
  file.flush();
  CPF_CHECK(file.good(), "profile: cannot write ", out_path_);
  return table;
}

}  // namespace cpf::trainer
