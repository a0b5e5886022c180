#pragma once
// What a training run reports: one console line per logging step, an optional progress bar (only
// when stdout is a terminal), a heartbeat line during long quiet stretches (only when it is not),
// train.log (the console lines with timestamps, train_log.h) and metrics.jsonl (one JSON object per
// line) in the run folder, and the closing summary line.
//
//   step   200/1500 | loss 0.8123 | lr 1.00e-03 | grad 0.412 | 14.2k tok/s | 1.64M tok | rss 312 MiB | 0:18 elapsed |
//   ETA 1:55 eval   200/1500 | loss 0.7904 | exact match 31.5% (63/200) heartbeat: step 201/1500 running for 0:31 |
//   0:49 elapsed | rss 312 MiB
//
// "loss" is the mean over the steps since the previous step line; "tok" counts every training token
// seen since step 1 (resumed runs included). CPU runs show the process's resident memory ("rss"); on
// cuda the line shows the allocator's peak instead: "... | 512.3k tok/s | 1.64G tok | peak mem 21.4 GiB | ...".
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>

#include "apps/report/checked_file.h"
#include "apps/report/heartbeat.h"
#include "apps/report/train_log.h"

namespace cpf::trainer {

struct StepMetrics {
  int64_t step = 0;  // 1-based: optimizer steps completed
  double loss = 0;   // mean over the steps since the previous step line
  double lr = 0;
  double grad_norm = 0;
  double tokens_per_second = 0;
  int64_t tokens_seen = 0;  // training tokens of steps 1..step (all ranks)
  double elapsed_seconds = 0;
  double eta_seconds = 0;
  std::optional<double> peak_memory_bytes;      // GPU runs: the caching allocator's peak on rank 0's device
  std::optional<double> memory_model_bytes;     // GPU runs: the memory planner's estimate (memory_plan.h)
  std::optional<double> resident_memory_bytes;  // CPU runs: the process's resident set (process_memory.h)
  std::optional<double> mfu;      // GPU runs on a known GPU: model FLOPs utilisation, 0..1 (docs/training.md)
  std::optional<double> mfu_fp8;  // run.precision: fp8 on a GPU with FP8 tensor cores: the same over the FP8 peak
  // fp8.recipe: delayed: the casts of the window whose amax outgrew their delayed scale (each clipped its
  // largest values), counted once per (call site, tensor) and step (framework/autograd/fp8_scaling.h)
  std::optional<int64_t> fp8_clipped;
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
// "950", "14.2k", "3.10M", "1.20G"
std::string format_count(double value);

struct LoggerOptions {
  std::string metrics_path;    // empty = no metrics.jsonl
  std::string train_log_path;  // empty = no train.log
  int64_t total_steps = 0;
  bool progress_bar = false;  // stdout is a terminal: draw a bar between log lines
  int rank = 0;               // the rank the lines are stamped with in train.log
  // Seconds of silence before a heartbeat line; 0 = none. The trainer uses kHeartbeatSeconds when
  // stdout is not a terminal (a terminal has the progress bar).
  double heartbeat_seconds = 0;
};

inline constexpr double kHeartbeatSeconds = 30;

class MetricsLogger {
 public:
  // metrics.jsonl and train.log are opened by start_metrics, once the run's start step is known
  // (nothing is written to the run folder before a resume is accepted). Every write is checked: a
  // line that cannot be written (a full disk, a closed stdout) throws naming where it went and the OS error.
  MetricsLogger(std::ostream& out, LoggerOptions options);
  ~MetricsLogger();

  // Keeps the records of metrics.jsonl up to `start_step` (each step is recorded once after a resume;
  // with drop_start_step_line also not the step line of `start_step`, whose steps the next line covers
  // again), opens it and train.log for appending, and returns the tokens seen up to the last kept step
  // line as it says: 0 for a fresh run, nullopt when the records do not tell (no metrics file, or one
  // written before tokens were recorded).
  std::optional<int64_t> start_metrics(int64_t start_step, bool drop_start_step_line = false);
  void step(const StepMetrics& m, bool print);          // recorded in metrics.jsonl only when print is true
  void eval(const EvalMetrics& m, bool record = true);  // record = false: console only
  void note(const std::string& line);                   // any other console line (checkpoints, resume, warnings)
  // The progress bar after step `step`: percent, ETA and tokens/s; no-op without a terminal.
  void progress(int64_t step, double elapsed_seconds, double eta_seconds, double tokens_per_second);
  // What the run does now, for the heartbeat line ("step 13/3000", "evaluation at step 200").
  void activity(const std::string& what);

 private:
  void clear_bar();
  void write_json(const std::string& line);
  void print_line(const std::string& line);  // to `out_` and train.log, checked; the caller holds mutex_
  void check_output();                       // throws, naming stdout's target and errno, once `out_` failed
  void heartbeat_line(const std::string& activity, double activity_seconds);

  std::ostream& out_;
  LoggerOptions options_;
  AppendOnlyFile metrics_;
  TrainLog train_log_;
  bool bar_shown_ = false;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  std::mutex mutex_;                      // the heartbeat thread prints too
  std::unique_ptr<Heartbeat> heartbeat_;  // last: its thread may call back into the fields above
};

// Rewrites metrics.jsonl to keep only the records of steps <= `step` (the step the run starts from),
// so a resumed run records every step once; with drop_step_line, the step line (a record with a loss) of
// `step` itself goes too (its evaluation stays). Lines that do not parse (a record torn by a crash) are
// dropped. Throws naming the path and the OS error when it cannot be read or written.
void truncate_metrics(const std::string& path, int64_t step, bool drop_step_line = false);

}  // namespace cpf::trainer
