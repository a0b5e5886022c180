#include "apps/trainer/metrics.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "apps/trainer/run_folder.h"
#include "framework/core/error.h"

namespace cpf::trainer {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "-";
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  } else {
    std::snprintf(buf, sizeof buf, "%lld:%02lld", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  }
  return buf;
}

std::string format_count(double v) {
  char buf[32];
  if (v >= 1e6) {
    std::snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
  } else if (v >= 1e3) {
    std::snprintf(buf, sizeof buf, "%.1fk", v / 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%.0f", v);
  }
  return buf;
}

MetricsLogger::MetricsLogger(std::ostream& out, const std::string& metrics_path, int64_t total_steps, bool progress_bar)
    : out_(out), metrics_path_(metrics_path), total_steps_(total_steps), progress_bar_(progress_bar) {}

void MetricsLogger::start_metrics(int64_t start_step) {
  if (metrics_path_.empty()) return;
  truncate_metrics(metrics_path_, start_step);
  metrics_ = AppendOnlyFile(metrics_path_);
}

void MetricsLogger::print_line(const std::string& line) {
  errno = 0;
  out_ << line << std::endl;
  check_output();
}

void MetricsLogger::check_output() {
  if (out_.good()) return;
  const int err = errno;
  // Where stdout goes, when it is a file (the console log of a batch job).
  std::error_code ec;
  const auto target = std::filesystem::read_symlink("/proc/self/fd/" + std::to_string(STDOUT_FILENO), ec);
  CPF_FAIL("cannot write the training log to standard output", ec ? std::string() : " (" + target.string() + ")",
           ": ", err != 0 ? std::strerror(err) : "the stream failed");
}

void MetricsLogger::clear_bar() {
  if (bar_shown_) {
    out_ << "\r\033[K";
    bar_shown_ = false;
  }
}

void MetricsLogger::write_json(const std::string& line) {
  if (!metrics_.is_open()) return;
  metrics_.append_line(line);
}

void MetricsLogger::step(const StepMetrics& m, bool print) {
  if (!print) return;
  clear_bar();
  char buf[256];
  const int width = static_cast<int>(std::to_string(total_steps_).size());
  char memory[64] = "";
  if (m.peak_memory_bytes) {
    const double gib = *m.peak_memory_bytes / 1073741824.0;  // MiB below 1 GiB, so small runs do not show 0.0
    if (gib >= 1.0) {
      std::snprintf(memory, sizeof memory, " | peak mem %.1f GiB", gib);
    } else {
      std::snprintf(memory, sizeof memory, " | peak mem %.0f MiB", gib * 1024.0);
    }
  }
  std::snprintf(buf, sizeof buf, "step %*lld/%lld | loss %.4f | lr %.2e | grad %.3f | %s tok/s%s | %s elapsed | ETA %s",
                width, static_cast<long long>(m.step), static_cast<long long>(total_steps_), m.loss, m.lr, m.grad_norm,
                format_count(m.tokens_per_second).c_str(), memory, format_duration(m.elapsed_seconds).c_str(),
                format_duration(m.eta_seconds).c_str());
  print_line(buf);
  nlohmann::json j = {{"step", m.step},           {"loss", m.loss},
                      {"lr", m.lr},               {"grad_norm", m.grad_norm},
                      {"tokens_per_s", m.tokens_per_second}, {"elapsed_s", m.elapsed_seconds}};
  if (m.peak_memory_bytes) j["peak_memory_bytes"] = *m.peak_memory_bytes;
  write_json(j.dump());
}

void MetricsLogger::eval(const EvalMetrics& m, bool record) {
  clear_bar();
  const int width = static_cast<int>(std::to_string(total_steps_).size());
  char buf[256];
  std::string line;
  std::snprintf(buf, sizeof buf, "eval %*lld/%lld", width, static_cast<long long>(m.step),
                static_cast<long long>(total_steps_));
  line = buf;
  nlohmann::json j = {{"step", m.step}};
  if (m.loss) {
    std::snprintf(buf, sizeof buf, " | loss %.4f", *m.loss);
    line += buf;
    j["eval_loss"] = *m.loss;
  }
  if (m.accuracy) {
    std::snprintf(buf, sizeof buf, " | exact match %.1f%% (%lld/%lld)", 100 * *m.accuracy,
                  static_cast<long long>(m.num_correct), static_cast<long long>(m.num_examples));
    line += buf;
    j["accuracy"] = *m.accuracy;
  }
  if (!m.loss && !m.accuracy) line += " | no held-out data (set run.eval_path)";
  print_line(line);
  if (record) write_json(j.dump());
}

void MetricsLogger::note(const std::string& line) {
  clear_bar();
  print_line(line);
}

void MetricsLogger::progress(int64_t step, double elapsed_seconds) {
  if (!progress_bar_) return;
  constexpr int kWidth = 30;
  const double frac = total_steps_ > 0 ? static_cast<double>(step) / static_cast<double>(total_steps_) : 1.0;
  const int filled = static_cast<int>(frac * kWidth);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(kWidth, '.');
  errno = 0;
  out_ << "\r[" << bar << "] " << static_cast<int>(frac * 100) << "% step " << step << "/" << total_steps_ << " "
       << format_duration(elapsed_seconds) << std::flush;
  check_output();
  bar_shown_ = true;
}

}  // namespace cpf::trainer
