#include "apps/report/metrics.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "apps/report/process_memory.h"
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
  if (v >= 1e9) {
    std::snprintf(buf, sizeof buf, "%.2fG", v / 1e9);
  } else if (v >= 1e6) {
    std::snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
  } else if (v >= 1e3) {
    std::snprintf(buf, sizeof buf, "%.1fk", v / 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%.0f", v);
  }
  return buf;
}

namespace {

// The "tokens" of the last record of metrics.jsonl (records are in step order after truncation).
std::optional<int64_t> tokens_of_last_record(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::optional<int64_t> tokens = 0;
  std::string line;
  bool any_step = false;
  while (std::getline(in, line)) {
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!record.is_object() || !record.contains("loss")) continue;  // eval records carry no tokens
    any_step = true;
    tokens = record.contains("tokens") && record["tokens"].is_number_integer()
                 ? std::optional<int64_t>(record["tokens"].get<int64_t>())
                 : std::nullopt;
  }
  return any_step ? tokens : std::optional<int64_t>(0);
}

}  // namespace

MetricsLogger::MetricsLogger(std::ostream& out, LoggerOptions options)
    : out_(out), options_(std::move(options)), train_log_(options_.train_log_path, options_.rank) {
  if (options_.heartbeat_seconds > 0) {
    heartbeat_ =
        std::make_unique<Heartbeat>(std::chrono::duration<double>(options_.heartbeat_seconds),
                                    [this](const std::string& what, double seconds) { heartbeat_line(what, seconds); });
  }
}

MetricsLogger::~MetricsLogger() { heartbeat_.reset(); }  // the thread ends before the fields it uses

std::optional<int64_t> MetricsLogger::start_metrics(int64_t start_step, bool drop_start_step_line) {
  std::lock_guard<std::mutex> lock(mutex_);
  train_log_.open();
  if (options_.metrics_path.empty()) return std::nullopt;
  truncate_metrics(options_.metrics_path, start_step, drop_start_step_line);
  // Only a regular file is read back: a FIFO or /dev/full in its place would never end.
  std::error_code ec;
  std::optional<int64_t> tokens = 0;
  if (std::filesystem::is_regular_file(options_.metrics_path, ec)) {
    tokens = tokens_of_last_record(options_.metrics_path);
  } else if (std::filesystem::exists(options_.metrics_path, ec)) {
    tokens = std::nullopt;
  }
  metrics_ = AppendOnlyFile(options_.metrics_path);
  return start_step == 0 ? 0 : tokens;
}

void MetricsLogger::print_line(const std::string& line) {
  errno = 0;
  out_ << line << std::endl;
  check_output();
  train_log_.write(line);
  if (heartbeat_) heartbeat_->printed();
}

void MetricsLogger::check_output() {
  if (out_.good()) return;
  const int err = errno;
  // Where stdout goes, when it is a file (the console log of a batch job).
  std::error_code ec;
  const auto target = std::filesystem::read_symlink("/proc/self/fd/" + std::to_string(STDOUT_FILENO), ec);
  CPF_FAIL("cannot write the training log to standard output", ec ? std::string() : " (" + target.string() + ")", ": ",
           err != 0 ? std::strerror(err) : "the stream failed");
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
  std::lock_guard<std::mutex> lock(mutex_);
  clear_bar();
  char buf[320];
  const int width = static_cast<int>(std::to_string(options_.total_steps).size());
  std::string memory;
  if (m.peak_memory_bytes) {
    memory = " | peak mem " + format_memory(*m.peak_memory_bytes) +
             (m.memory_model_bytes ? " (model " + format_memory(*m.memory_model_bytes) + ")" : "");
  } else if (m.resident_memory_bytes) {
    memory = " | rss " + format_memory(*m.resident_memory_bytes);
  }
  char mfu[64] = "";
  if (m.mfu && m.mfu_fp8) {
    std::snprintf(mfu, sizeof mfu, " | MFU %.1f%% (%.1f%% of FP8 peak)", 100.0 * *m.mfu, 100.0 * *m.mfu_fp8);
  } else if (m.mfu) {
    std::snprintf(mfu, sizeof mfu, " | MFU %.1f%%", 100.0 * *m.mfu);
  }
  // Shown only when some cast clipped: a sign to raise fp8.margin or use current scaling (docs/fp8.md).
  const std::string clipped =
      m.fp8_clipped && *m.fp8_clipped > 0 ? " | fp8 clipped " + std::to_string(*m.fp8_clipped) : "";
  std::snprintf(buf, sizeof buf,
                "step %*lld/%lld | loss %.4f | lr %.2e | grad %.3f | %s tok/s%s | %s tok%s%s | %s elapsed | ETA %s",
                width, static_cast<long long>(m.step), static_cast<long long>(options_.total_steps), m.loss, m.lr,
                m.grad_norm, format_count(m.tokens_per_second).c_str(), mfu,
                format_count(static_cast<double>(m.tokens_seen)).c_str(), memory.c_str(), clipped.c_str(),
                format_duration(m.elapsed_seconds).c_str(), format_duration(m.eta_seconds).c_str());
  print_line(buf);
  nlohmann::json j = {{"step", m.step},
                      {"loss", m.loss},
                      {"lr", m.lr},
                      {"grad_norm", m.grad_norm},
                      {"tokens_per_s", m.tokens_per_second},
                      {"tokens", m.tokens_seen},
                      {"elapsed_s", m.elapsed_seconds}};
  if (m.peak_memory_bytes) j["peak_memory_bytes"] = *m.peak_memory_bytes;
  if (m.memory_model_bytes) j["memory_model_bytes"] = *m.memory_model_bytes;
  if (m.resident_memory_bytes) j["rss_bytes"] = *m.resident_memory_bytes;
  if (m.mfu) j["mfu"] = *m.mfu;
  if (m.mfu_fp8) j["mfu_fp8"] = *m.mfu_fp8;
  if (m.fp8_clipped) j["fp8_clipped"] = *m.fp8_clipped;
  write_json(j.dump());
}

void MetricsLogger::eval(const EvalMetrics& m, bool record) {
  std::lock_guard<std::mutex> lock(mutex_);
  clear_bar();
  const int width = static_cast<int>(std::to_string(options_.total_steps).size());
  char buf[256];
  std::snprintf(buf, sizeof buf, "eval %*lld/%lld", width, static_cast<long long>(m.step),
                static_cast<long long>(options_.total_steps));
  std::string line = buf;
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
  std::lock_guard<std::mutex> lock(mutex_);
  clear_bar();
  print_line(line);
}

void MetricsLogger::activity(const std::string& what) {
  if (heartbeat_) heartbeat_->activity(what);
}

void MetricsLogger::heartbeat_line(const std::string& activity, double activity_seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  clear_bar();
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  std::string line = "heartbeat: " + activity + " running for " + format_duration(activity_seconds) + " | " +
                     format_duration(elapsed) + " elapsed";
  if (const auto rss = resident_memory()) line += " | rss " + format_memory(static_cast<double>(rss->current_bytes));
  print_line(line);
}

void MetricsLogger::progress(int64_t step, double elapsed_seconds, double eta_seconds, double tokens_per_second) {
  if (!options_.progress_bar) return;
  std::lock_guard<std::mutex> lock(mutex_);
  constexpr int kWidth = 30;
  const int64_t total = options_.total_steps;
  const double frac = total > 0 ? static_cast<double>(step) / static_cast<double>(total) : 1.0;
  const int filled = static_cast<int>(frac * kWidth);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(kWidth, '.');
  errno = 0;
  out_ << "\r[" << bar << "] " << static_cast<int>(frac * 100) << "% step " << step << "/" << total << " | "
       << format_count(tokens_per_second) << " tok/s | " << format_duration(elapsed_seconds) << " elapsed | ETA "
       << format_duration(eta_seconds) << std::flush;
  check_output();
  bar_shown_ = true;
}

void truncate_metrics(const std::string& path, int64_t step, bool drop_step_line) {
  // Only a regular file is rewritten: a FIFO or device the user put there is theirs (and reading
  // /dev/full or /dev/zero would never end).
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return;
  std::ifstream in(path, std::ios::binary);
  CPF_CHECK(in.good(), "cannot read ", path, ": ", std::strerror(errno));
  std::ostringstream kept;
  std::string line;
  bool dropped = false;
  while (std::getline(in, line)) {
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    const bool keep = record.is_object() && record.contains("step") && record["step"].is_number_integer() &&
                      record["step"].get<int64_t>() <= step &&
                      !(drop_step_line && record["step"].get<int64_t>() == step && record.contains("loss"));
    if (keep) {
      kept << line << '\n';
    } else {
      dropped = true;
    }
  }
  CPF_CHECK(in.eof(), "cannot read ", path, ": ", std::strerror(errno));
  if (dropped) write_file_atomically(path, kept.str());
}

}  // namespace cpf::trainer
