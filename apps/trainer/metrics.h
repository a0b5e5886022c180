#pragma once
// What a training run reports: one console line per logging step, an optional progress bar (only
// when stdout is a terminal), metrics.jsonl in the run folder (one JSON object per line), and the
// closing summary line.
//
//   step   200/1500 | loss 0.8123 | lr 1.00e-03 | grad 0.412 | 14.2k tok/s | 0:18 elapsed | ETA 1:55
//   eval   200/1500 | loss 0.7904 | exact match 31.5% (63/200)
//
// On cuda the step line also shows the allocator's peak: "... | 512.3k tok/s | peak mem 21.4 GiB | ...".
#include <chrono>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>

#include "apps/trainer/checked_file.h"

namespace cpf::trainer {

struct StepMetrics {
  int64_t step = 0;  // 1-based: optimizer steps completed
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  double tokens_per_second = 0;
  double elapsed_seconds = 0;
  double eta_seconds = 0;
  std::optional<double> peak_memory_bytes;  // GPU runs: the caching allocator's peak on rank 0's device
};

struct EvalMetrics {
  int64_t step = 0;
  std::optional<double> loss;      // held-out loss, when there is held-out data
  std::optional<double> accuracy;  // synthetic exact match
  int64_t num_correct = 0;
  int64_t num_examples = 0;
};

// "1:05", "1:02:03" for a duration in seconds.
std::string format_duration(double seconds);
// "950", "14.2k", "3.10M"
std::string format_count(double value);

class MetricsLogger {
 public:
  // `metrics_path` empty = no metrics.jsonl; it is opened by start_metrics, once the run's start step is
  // known (nothing is written to the run folder before a resume is accepted). `progress_bar`: draw a
  // bar between log lines. Every write is checked: a line that cannot be written (a full disk, a
  // closed stdout) throws naming where it went and the OS error.
  MetricsLogger(std::ostream& out, const std::string& metrics_path, int64_t total_steps, bool progress_bar);

  // Keeps the records of metrics.jsonl up to `start_step` (each step is recorded once after a resume)
  // and opens it for appending.
  void start_metrics(int64_t start_step);
  void step(const StepMetrics& m, bool print);  // recorded in metrics.jsonl only when print is true
  void eval(const EvalMetrics& m, bool record = true);  // record = false: console only
  void note(const std::string& line);  // any other console line (checkpoints, resume, warnings)
  // The progress bar after step `step`; no-op without a terminal.
  void progress(int64_t step, double elapsed_seconds);

 private:
  void clear_bar();
  void write_json(const std::string& line);
  void print_line(const std::string& line);  // to `out_`, checked
  void check_output();  // throws, naming stdout's target and errno, once `out_` failed

  std::ostream& out_;
  std::string metrics_path_;
  AppendOnlyFile metrics_;
  int64_t total_steps_;
  bool progress_bar_;
  bool bar_shown_ = false;
};

}  // namespace cpf::trainer
