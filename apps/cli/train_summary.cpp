#include "apps/cli/train_summary.h"

#include <cstdio>
#include <filesystem>

#include "apps/report/train_log.h"

namespace cpf::trainer {
namespace {

std::string percent(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100 * v);
  return buf;
}

std::string fixed(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.4f", v);
  return buf;
}

std::string target_text(const TrainConfig& c) {
  std::string target;
  if (c.run.target_accuracy > 0) target = "exact match >= " + percent(c.run.target_accuracy);
  if (c.run.target_loss > 0)
    target += (target.empty() ? "" : " or ") + std::string("eval loss <= ") + fixed(c.run.target_loss);
  return target;
}

}  // namespace

std::string summary_line(const TrainConfig& c, const TrainOutcome& r) {
  std::string line = "done: step " + std::to_string(r.final_step) + "/" + std::to_string(c.run.steps) + " in " +
                     format_duration(r.seconds);
  if (r.train_loss) {
    const int64_t first = r.final_step - r.train_loss_steps + 1;
    line +=
        " | train loss " + fixed(*r.train_loss) +
        (r.train_loss_steps > 1 ? " (mean of steps " + std::to_string(first) + "-" + std::to_string(r.final_step) + ")"
                                : " (step " + std::to_string(r.final_step) + ")");
  }
  if (r.last_eval && r.last_eval->loss) line += " | eval loss " + fixed(*r.last_eval->loss);
  if (r.last_eval && r.last_eval->accuracy) {
    line += " | exact match " + percent(*r.last_eval->accuracy) + " (" + std::to_string(r.last_eval->num_correct) +
            "/" + std::to_string(r.last_eval->num_examples) + ")";
  }
  if (r.tokens_seen > 0) line += " | " + format_count(static_cast<double>(r.tokens_seen)) + " tok";
  if (r.tokens_per_second) line += " | " + format_count(*r.tokens_per_second) + " tok/s";
  if (r.mfu) line += " | MFU " + percent(*r.mfu);
  if (r.mfu_fp8) line += " (" + percent(*r.mfu_fp8) + " of FP8 peak)";
  if (r.target_set) {
    line += " | target " + target_text(c) +
            (r.target_reached ? " reached at step " + std::to_string(r.target_step) : std::string(" NOT reached"));
  }
  return line + " | " + r.run_dir;
}

void append_to_train_log(const TrainOutcome& outcome, const std::string& line) {
  append_train_log_line((std::filesystem::path(outcome.run_dir) / "train.log").string(), line);
}

}  // namespace cpf::trainer
