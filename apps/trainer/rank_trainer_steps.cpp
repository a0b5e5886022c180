// RankTrainer's steps: the loop, one step and its records, the read-back windows (rank_trainer.h).
#include "apps/trainer/rank_trainer.h"

#include <cmath>
#include <filesystem>

#include "apps/run/init_from.h"
#include "apps/run/run_folder.h"
#include "apps/trainer/step/grad_accumulation.h"
#include "apps/trainer/step/sync_check.h"
#include "apps/trainer/stop_signals.h"

namespace cpf::trainer {
namespace fs = std::filesystem;

void leave_if_stopped_during_setup(Shared& shared) {
  const int signal = pending_stop_signal();
  if (signal == 0) return;
  shared.setup_stop_signal = signal;
  CPF_FAIL("stopped by ", stop_signal_name(signal), " during setup, before the first step: nothing to save");
}

void RankTrainer::start_session() {
  leave_if_stopped_during_setup(shared_);
  resume();
  if (!c_.run.init_from.empty()) {
    // Fine-tuning starts from these weights; a resumed run continues its own (init_from.h).
    if (shards_ && !shared_.resume_path) shards_->acquire_all();  // sharded parameters: whole while loaded
    const std::string loaded = shared_.resume_path ? "" : load_init_weights(c_.run.init_from, c_, params_);
    if (shards_ && !shared_.resume_path) shards_->adopt_parameters();
    if (logger_)
      logger_->note(loaded.empty() ? "run.init_from ignored: resuming this run's checkpoint" : "init_from: " + loaded);
  }
  start_writing();
  start_step_graph();
  if (logger_ && accum_steps_ > 1) {
    logger_->note("gradient accumulation: " + std::to_string(accum_steps_) + " micro-batches per step (" +
                  std::to_string(accum_steps_ * micro_step_tokens(c_)) + " tokens per step over " +
                  std::to_string(groups_.dp_size) + " DP rank(s))");
  }
}

// run.cuda_graph (step_graph.h): one GPU captures its steps; a GPU run that cannot says why once.
void RankTrainer::start_step_graph() {
  const std::optional<std::string> reason = StepGraph::unsupported_reason(c_, device_);
  if (!reason) {
    step_graph_ = std::make_unique<StepGraph>([this](const std::string& line) {
      if (logger_) logger_->note(line);
    });
  } else if (logger_ && device_.is_cuda() && c_.run.cuda_graph) {
    logger_->note("cuda graph: off: " + *reason);
  }
}

void RankTrainer::record_step(Session& s, const StepResult& r, double seconds) {
  if (step_ == s.start + 1) {
    // Without a record of the tokens before a resume, every step is assumed this size.
    tokens_seen_ = tokens_at_start_.value_or(s.start * r.tokens);
  }
  tokens_seen_ += r.tokens;
  s.session_tokens += r.tokens;
  shared_.outcome.losses.push_back(r.loss);
  shared_.outcome.tokens_seen = tokens_seen_;
  s.window.seconds += seconds;
  s.window.loss += r.loss;
  s.window.tokens += r.tokens;
  ++s.window.steps;
  if (step_ % c_.run.log_every == 0 || step_ == c_.run.steps) log_step(s);
  const double per_step = s.train_seconds / static_cast<double>(step_ - s.start);
  logger_->progress(step_, seconds_since(s.t0), per_step * static_cast<double>(c_.run.steps - step_),
                    static_cast<double>(s.session_tokens) / std::max(s.train_seconds, 1e-9));
}

// One step and what follows it: its records, the non-finite check, evaluation and checkpoint. True when
// the evaluation reached a target.
bool RankTrainer::run_one_step(Session& s, const StepProfiler& profile_window, StepProfiler& profiler) {
  if (logger_) logger_->activity("step " + std::to_string(step_ + 1) + "/" + std::to_string(c_.run.steps));
  const auto s0 = Clock::now();
  profiler.begin_step(step_ + 1);
  if (profile_window.starts_window(step_ + 1)) groups_.world->barrier();
  const SyncCheck sync_check(device_);
  if (window_) {  // one rank: the step's records wait for the window's read-back
    if (window_->empty()) s.window_t0 = s0;
    train_step_deferred(step_);
    ++step_;
    if (must_read_back()) drain_window(s);
    if (logger_) {
      if (const std::optional<std::string> line = sync_check.line(step_)) logger_->note(*line);
    }
    if (!window_->empty()) return false;  // not an evaluation or checkpoint step (must_read_back)
  } else {
    const StepResult r = train_step(step_);
    ++step_;
    if (logger_) {
      if (const std::optional<std::string> line = sync_check.line(step_)) logger_->note(*line);
    }
    s.norm = r.grad_norm;
    s.nonfinite_steps = std::isfinite(r.grad_norm) ? 0 : s.nonfinite_steps + 1;
    const double dt = seconds_since(s0);
    s.train_seconds += dt;
    // After the step's timing: the table waits for the window's GPU events.
    if (profile_window.ends_window(step_)) groups_.world->barrier();
    if (const std::optional<std::string> table = profiler.end_step(step_)) logger_->note(*table);
    if (rank0()) record_step(s, r, dt);
    check_nonfinite_steps(s.nonfinite_steps, s.norm);
  }
  bool stop = false;
  if (c_.run.eval_every > 0 && step_ % c_.run.eval_every == 0) {
    stop = evaluate(step_);
    s.evaluated_at = step_;
  }
  if ((c_.run.checkpoint_every > 0 && step_ % c_.run.checkpoint_every == 0) || (stop && s.saved_at != step_)) {
    checkpoint(step_, open_log_window(s));
    s.saved_at = step_;
  }
  return stop;
}

void RankTrainer::finish(Session& s) {
  // A run that stopped at its target between step lines: its last steps get their line, so the
  // summary's train loss is a printed one.
  if (rank0() && s.window.steps > 0) log_step(s);
  // No step replays any more: the captured graph's private memory pool goes back before the last
  // evaluation, which would otherwise allocate beside it (at a context near the device's limit, it does not fit).
  step_graph_.reset();
  // A finished run resumed again evaluates for its summary without recording that step twice.
  if (s.evaluated_at != step_) evaluate(step_, step_ != s.start || !shared_.resume_path);
  if (s.saved_at != step_) checkpoint(step_, open_log_window(s));
  if (rank0()) {
    shared_.outcome.final_step = step_;
    shared_.outcome.seconds = seconds_since(s.t0);
    if (s.session_tokens > 0 && s.train_seconds > 0) {
      const double rate = s.steady_seconds > 0 ? static_cast<double>(s.steady_tokens) / s.steady_seconds
                                               : static_cast<double>(s.session_tokens) / s.train_seconds;
      shared_.outcome.tokens_per_second = rate;
      shared_.outcome.mfu = mfu(rate);
      shared_.outcome.mfu_fp8 = mfu_fp8(rate);
    }
  }
}

LogWindow RankTrainer::open_log_window(const Session& s) const {
  return s.window.steps > 0 ? s.window : s.partial_line;
}

void RankTrainer::run() {
  start_session();
  Session s;
  s.start = step_;
  if (resumed_window_) s.window = *resumed_window_;  // the steps the checkpoint's run had not logged yet
  s.saved_at = shared_.resume_path ? step_ : -1;     // the checkpoint we resumed from is this step's
  if (rank0()) shared_.outcome.start_step = s.start;
  // Recording is process-wide: rank 0 switches it on and off while every rank waits between steps
  // (thread ranks record into one table; other processes' ranks record nothing).
  const StepProfiler profile_window(c_.run.profile, s.start, c_.run.steps, device_, "");
  StepProfiler profiler(rank0() ? c_.run.profile : 0, s.start, c_.run.steps, device_,
                        (fs::path(run_dir(c_)) / "profile.txt").string());
  s.t0 = Clock::now();
  bool stop = false;
  while (step_ < c_.run.steps && !stop) {
    if (const int signal = agreed_stop_signal()) {
      drain_window(s);  // the steps before the stop get their records
      return stop_on_signal(signal, s.saved_at, seconds_since(s.t0), open_log_window(s));
    }
    stop = run_one_step(s, profile_window, profiler);
  }
  finish(s);
}

}  // namespace cpf::trainer
