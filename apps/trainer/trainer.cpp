#include "apps/trainer/trainer.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#if defined(CPF_WITH_OPENMP)
#include <omp.h>
#endif

#include "apps/trainer/checked_file.h"
#include "apps/trainer/checkpointing.h"
#include "apps/trainer/device_memory.h"
#include "apps/trainer/device_peak.h"
#include "apps/trainer/evaluation.h"
#include "apps/trainer/grad_accumulation.h"
#include "apps/trainer/init_from.h"
#include "apps/trainer/process_memory.h"
#include "apps/trainer/resume_rules.h"
#include "apps/trainer/run_folder.h"
#include "apps/trainer/run_plot.h"
#include "apps/trainer/run_tokenizer.h"
#include "apps/trainer/step_graph.h"
#include "apps/trainer/step_prefetch.h"
#include "apps/trainer/step_profiler.h"
#include "apps/trainer/step_window.h"
#include "apps/trainer/stop_signals.h"
#include "apps/trainer/sync_check.h"
#include "apps/trainer/training_step.h"
#include "framework/autograd/ops.h"
#include "framework/distributed/autograd_collectives.h"
#include "framework/distributed/device_mesh.h"
#include "framework/distributed/environment.h"
#include "framework/distributed/grad_reducer.h"
#include "framework/distributed/launcher.h"
#include "framework/distributed/rendezvous_tcp.h"
#if CPF_HAVE_NCCL
#include "framework/distributed/nccl/nccl_init.h"
#endif
#include "framework/tensor/profile.h"
#include "models/model_flops.h"

namespace cpf::trainer {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The rank's model replica: drawn on the CPU from the run seed (the same on every rank and device), then
// moved to the rank's device, so CPU and GPU runs start from identical weights.
std::unique_ptr<models::GPT> make_model(const TrainConfig& c, Generator* gen, Device device) {
  auto model = std::make_unique<models::GPT>(model_options(c), gen);
  model->to(device);
  return model;
}

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& c, const optim::NamedTensors& params) {
  const OptimizerOptions& o = c.optimizer;
  if (o.type == OptimizerType::sgd) {
    return std::make_unique<optim::SGD>(params, optim::SGDOptions{.lr = o.lr,
                                                                  .momentum = o.momentum,
                                                                  .nesterov = o.nesterov,
                                                                  .weight_decay = o.weight_decay,
                                                                  .decay_all = o.decay_all});
  }
  return std::make_unique<optim::AdamW>(params, optim::AdamWOptions{.lr = o.lr,
                                                                    .beta1 = o.beta1,
                                                                    .beta2 = o.beta2,
                                                                    .eps = o.eps,
                                                                    .weight_decay = o.weight_decay,
                                                                    .decay_all = o.decay_all});
}

// What the rank threads share. Rank 0 writes; a barrier separates every write from the reads.
struct Shared {
  std::optional<std::string> resume_path;
  TrainOutcome outcome;
  // One process per rank (torchrun/srun/mpirun): nothing is shared between ranks, each process finds
  // the checkpoint to resume itself and the ranks check that they agree.
  bool process_per_rank = false;
};

struct Sources {
  std::shared_ptr<const data::DocumentSource> train, eval;
};

class RankTrainer {
 public:
  RankTrainer(const TrainConfig& config, dist::RankContext& ctx, Shared& shared, const Sources& sources,
              MetricsLogger* logger)
      : c_(config),
        shared_(shared),
        sources_(sources),
        logger_(logger),
        mesh_(ctx.world, dist::MeshShape{.dp = static_cast<int>(config.parallel.dp),
                                         .cp = static_cast<int>(config.parallel.cp),
                                         .cp_a2a = a2a_size(config),
                                         .cp_p2p = 0,
                                         .require_cp = false,
                                         .hierarchical_cp = a2a_size(config) > 0}),
        device_(ctx.device),
        gen_(static_cast<uint64_t>(config.run.seed)),
        model_(make_model(config, &gen_, ctx.device)),
        params_(model_->named_parameters()),
        optimizer_(make_optimizer(config, params_)),
        schedule_(schedule_options(config)) {
    groups_.world = ctx.world;
    groups_.dp_rank = mesh_.coord().dp;
    groups_.dp_size = mesh_.layout().dp();
    groups_.cp_rank = mesh_.coord().cp;
    groups_.cp_size = mesh_.layout().cp();
    if (groups_.cp_size > 1) {
      groups_.cp = cp::ContextParallel{config.parallel.cp_comm_type, mesh_.cp(), mesh_.cp_a2a(), mesh_.cp_p2p(),
                                       attention_kernel_config(config)};
      groups_.cp->mla_latent = config.attention.cp_mla_latent;
      groups_.cp->a2a_head_groups = static_cast<int>(config.parallel.cp_a2a_head_groups);
    }
    for (const auto& [name, t] : params_) tensors_.push_back(t);
    // Gradients are summed over the world in buckets that start during backward, each as soon as its
    // parameters' gradients are final (the loss is already divided by the world's token count).
    if (groups_.world->size() > 1) {
      reducer_ = std::make_unique<dist::GradientReducer>(tensors_, groups_.world,
                                                         dist::GradientReducerOptions{.op = dist::ReduceOp::sum});
      prefetch_ = std::make_unique<StepPrefetch>(pending_stop_signal);  // step_prefetch.h
    } else if (config.run.profile == 0) {
      window_ = std::make_unique<StepWindow>(device_);  // steps read back in windows (step_window.h)
    }
    loader_ = std::make_unique<data::DataLoader>(sources.train, config.data, groups_.dp_rank, groups_.dp_size);
    accum_steps_ = grad_accum_steps(config);
  }

  void run();
  int64_t num_parameters() const { return model_->num_parameters(); }

 private:
  static int a2a_size(const TrainConfig& c) {
    return c.parallel.cp > 1 && c.parallel.cp_comm_type == cp::CommType::a2a_p2p
               ? static_cast<int>(c.parallel.cp_a2a_size)
               : 0;
  }
  bool rank0() const { return groups_.world->rank() == 0; }
  std::optional<double> peak_memory() const {
    const auto bytes = peak_device_memory(device_);
    return bytes ? std::optional<double>(static_cast<double>(*bytes)) : std::nullopt;
  }
  // Model FLOPs utilisation of the world's GPUs at `tokens_per_second` (all ranks' tokens): model FLOPs
  // (models/model_flops.h) over the dense bf16 peak of every GPU (device_peak.h); none on the CPU or an
  // unknown GPU.
  std::optional<double> mfu(double tokens_per_second) const {
    if (!device_.is_cuda()) return std::nullopt;
    const std::optional<double> peak = dense_bf16_peak(device_);
    if (!peak) return std::nullopt;
    const double flops = models::training_flops_per_token(model_->options(), num_parameters(), c_.data.seq_len);
    return flops * tokens_per_second / (*peak * static_cast<double>(groups_.world->size()));
  }
  // CPU runs: the process's resident memory (a GPU run shows its device peak instead).
  std::optional<double> resident_bytes() const {
    if (device_.is_cuda()) return std::nullopt;
    const auto rss = resident_memory();
    return rss ? std::optional<double>(static_cast<double>(rss->current_bytes)) : std::nullopt;
  }
  void resume();
  void start_writing();     // the run folder's config.yaml and metrics.jsonl, once the start is accepted
  void start_step_graph();  // run.cuda_graph: the step graph, or why a GPU run has none
  int agreed_stop_signal();
  void stop_on_signal(int signal, int64_t saved_at, double seconds);
  void check_nonfinite_steps(int64_t consecutive, double norm) const;
  StepParts step_parts();
  StepResult train_step(int64_t step);
  void note_skipped(int64_t step, const StepResult& r);  // rank 0; `step` 1-based
  bool evaluate(int64_t step, bool record = true);       // true when a target is reached
  void checkpoint(int64_t step);
  // Rank 0: the steps since the last step line, printed as one line (their mean loss).
  struct LogWindow {
    double seconds = 0, loss = 0;
    int64_t tokens = 0, steps = 0;
  };
  // The state of one call of run(): where it started and what its loop has seen so far.
  struct Session {
    int64_t start = 0;
    Clock::time_point t0;
    double train_seconds = 0;
    LogWindow window;
    int64_t saved_at = -1;  // the step of the newest checkpoint (the one resumed from counts)
    int64_t evaluated_at = -1;
    int64_t nonfinite_steps = 0;  // consecutive steps with a non-finite gradient norm
    double norm = 0;
    int64_t session_tokens = 0;   // this call's steps, for the progress bar's rate
    Clock::time_point window_t0;  // when the first step in the step window began
  };
  void start_session();  // resume or init_from, the run folder's files, the accumulation note
  bool run_one_step(Session& s, const StepProfiler& profile_window, StepProfiler& profiler);
  void record_step(Session& s, const StepResult& r, double seconds);  // rank 0
  bool must_read_back() const;
  void drain_window(Session& s);
  void finish(Session& s);
  void log_step(Session& s);

  const TrainConfig& c_;
  Shared& shared_;
  Sources sources_;
  MetricsLogger* logger_;  // rank 0 only
  dist::DeviceMesh mesh_;
  RankGroups groups_;
  Device device_;
  Generator gen_;
  std::unique_ptr<models::GPT> model_;
  optim::NamedTensors params_;
  std::vector<Tensor> tensors_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  optim::LrSchedule schedule_;
  std::unique_ptr<dist::GradientReducer> reducer_;  // null on one rank
  std::unique_ptr<StepPrefetch> prefetch_;          // null on one rank
  std::unique_ptr<StepGraph> step_graph_;           // null: every step eager (step_graph.h)
  // One rank without run.profile: steps enqueued without a wait, read back when the host must (step_window.h).
  std::unique_ptr<StepWindow> window_;
  std::unique_ptr<data::DataLoader> loader_;
  int64_t step_ = 0;
  int64_t accum_steps_ = 1;                 // micro-batches per optimizer step
  int64_t tokens_seen_ = 0;                 // rank 0: training tokens of steps 1..step_, resumed sessions included
  std::optional<int64_t> tokens_at_start_;  // rank 0: from metrics.jsonl; nullopt when it does not tell
  std::string last_checkpoint_;
};

void RankTrainer::resume() {
  if (c_.run.resume != ResumeMode::auto_resume) return;  // never / replace start over (apply_start_mode)
  if (rank0() || shared_.process_per_rank) {
    try {
      shared_.resume_path = find_resume_checkpoint(c_, params_, *optimizer_);
    } catch (const Error&) {
      // A checkpoint of another config: name the keys that differ instead of two hashes.
      if (auto why = explain_config_mismatch(c_)) CPF_FAIL(*why);
      throw;
    }
  }
  groups_.world->barrier();
  if (shared_.resume_path) {
    const ResumeState state = load_training_checkpoint(*shared_.resume_path, c_, params_, *optimizer_);
    check_resume_step(c_, state.step, *shared_.resume_path);
    loader_->set_cursor(state.cursor);
    step_ = state.step;
  }
  if (shared_.process_per_rank) {
    // Every process must resume from the same step (a run folder that is not on a shared filesystem
    // would silently restart some ranks from scratch).
    const Tensor mine = full({1}, static_cast<double>(step_), {.dtype = DType::f64, .device = device_});
    const double lo = groups_.world->all_reduce(mine, dist::ReduceOp::min).item<double>();
    const double hi = groups_.world->all_reduce(mine, dist::ReduceOp::max).item<double>();
    CPF_CHECK(lo == hi, "resume: the ranks found different checkpoints (steps ", lo, " to ", hi, "); the run folder ",
              run_dir(c_), " must be on a filesystem every rank sees, or set run.resume: replace");
  }
  if (!shared_.resume_path || !logger_) return;
  logger_->note("resumed from " + *shared_.resume_path + " at step " + std::to_string(step_));
  const TrainConfig saved = checkpoint_config(*shared_.resume_path);
  if (auto warning = schedule_change_warning(saved, c_, step_)) logger_->note(*warning);
}

void RankTrainer::start_writing() {
  if (!logger_) return;  // only the writing process's rank 0 has a logger
  const std::string yaml = "# Effective config of this run (written by cpformer train; defaults filled in).\n";
  write_file_atomically((fs::path(run_dir(c_)) / "config.yaml").string(), yaml + to_yaml(c_));
  record_run_tokenizer(c_, run_dir(c_));  // generate finds data.tokenizer's file here (run_tokenizer.h)
  tokens_at_start_ = logger_->start_metrics(step_);
}

int RankTrainer::agreed_stop_signal() {
  const int mine = pending_stop_signal();
  if (groups_.world->size() == 1) return mine;
  // Ranks see a signal at different moments, or only some processes get one: every rank must stop
  // after the same step, or the others would wait in a collective forever. The step that just ran
  // agreed on it (all-reduced with the step, read at its event: step_prefetch.h); only before a
  // session's first step do the ranks agree here, with an all-reduce the host waits for.
  if (const std::optional<int> agreed = prefetch_->take_agreed_stop_signal()) return *agreed;
  const Tensor flag = full({1}, static_cast<double>(mine), {.dtype = DType::f64, .device = device_});
  return static_cast<int>(groups_.world->all_reduce(flag, dist::ReduceOp::max).item<double>());
}

void RankTrainer::stop_on_signal(int signal, int64_t saved_at, double seconds) {
  const bool save = step_ > 0 && saved_at != step_;
  if (save) checkpoint(step_);
  if (rank0() || shared_.process_per_rank) shared_.outcome.stop_signal = signal;
  if (rank0()) {
    shared_.outcome.final_step = step_;
    shared_.outcome.seconds = seconds;
  }
  if (!logger_) return;
  std::string where = "nothing to save (no step was trained)";
  if (save) {
    where = "checkpoint " + last_checkpoint_;
  } else if (step_ > 0) {
    where = "its checkpoint is " + (last_checkpoint_.empty() ? shared_.resume_path.value_or("") : last_checkpoint_);
  }
  logger_->note(std::string("stopped by ") + stop_signal_name(signal) + " after step " + std::to_string(step_) + "/" +
                std::to_string(c_.run.steps) + ": " + where);
}

void RankTrainer::check_nonfinite_steps(int64_t consecutive, double norm) const {
  const int64_t limit = c_.run.max_nonfinite_steps;
  if (limit == 0 || consecutive < limit) return;
  CPF_FAIL("step ", step_, ": the gradient norm was not finite (", norm, ") for ", consecutive,
           " consecutive steps (run.max_nonfinite_steps=", limit, "), every update skipped; stopping without a ",
           "checkpoint (the newest in ", checkpoints_dir(c_), ", if any, is from before). Lower optimizer.lr, ",
           "set run.grad_clip, or look for NaN/Inf in the data or the weights");
}

StepParts RankTrainer::step_parts() {
  return StepParts{.model = *model_,
                   .loader = *loader_,
                   .groups = groups_,
                   .reducer = reducer_.get(),
                   .params = params_,
                   .optimizer = *optimizer_,
                   .schedule = schedule_,
                   .accum_steps = accum_steps_,
                   .grad_clip = c_.run.grad_clip,
                   .prefetch = prefetch_.get(),
                   .graph = step_graph_.get()};
}

void RankTrainer::note_skipped(int64_t step, const StepResult& r) {
  if (r.skipped && rank0()) {
    logger_->note("step " + std::to_string(step) + ": gradient norm " + std::to_string(r.grad_norm) +
                  ", update skipped");
  }
}

StepResult RankTrainer::train_step(int64_t step) {
  const StepResult r = training_step(step_parts(), step);
  note_skipped(step + 1, r);
  return r;
}

// The step window is read when the host must know its steps: a step line, an evaluation, a checkpoint,
// the last step, a stop signal; and when it is full.
bool RankTrainer::must_read_back() const {
  const auto every = [this](int64_t n) { return n > 0 && step_ % n == 0; };
  return window_->full() || step_ == c_.run.steps || every(c_.run.log_every) || every(c_.run.eval_every) ||
         every(c_.run.checkpoint_every) || pending_stop_signal() != 0;
}

// Reads the window's steps back (one copy, one wait), settles the optimizer with their outcomes, then
// records each step in order as run_one_step records a step it waited for, step_ walking through them.
void RankTrainer::drain_window(Session& s) {
  if (!window_ || window_->empty()) return;
  const int64_t last = step_;
  std::vector<StepResult> results;
  try {
    results = window_->read();  // device errors of the steps (e.g. a bad token id) are reported here
  } catch (...) {
    if (optimizer_->deferred_in_flight() > 0) optimizer_->abandon();  // whether the updates landed is unknown
    throw;
  }
  std::vector<bool> applied;
  for (const StepResult& r : results) applied.push_back(!r.skipped);
  optimizer_->settle(applied);
  // Step times: the wall time since the window's first step began, spread evenly over its steps.
  const double dt = seconds_since(s.window_t0) / static_cast<double>(results.size());
  step_ = last - static_cast<int64_t>(results.size());
  for (const StepResult& r : results) {
    ++step_;
    note_skipped(step_, r);
    s.norm = r.grad_norm;
    s.nonfinite_steps = std::isfinite(r.grad_norm) ? 0 : s.nonfinite_steps + 1;
    s.train_seconds += dt;
    if (rank0()) record_step(s, r, dt);
    check_nonfinite_steps(s.nonfinite_steps, s.norm);
  }
}

bool RankTrainer::evaluate(int64_t step, bool record) {
  CPF_CHECK(!window_ || window_->empty(), "evaluation at step ", step, ": ", window_ ? window_->size() : 0,
            " step(s) are not read back yet (a bug of the step window)");
  if (logger_) logger_->activity("evaluation at step " + std::to_string(step));
  EvalMetrics m;
  m.step = step;
  m.loss = eval_loss(*model_, c_, sources_.eval, groups_);
  if (const data::SyntheticSource* synthetic = loader_->synthetic(); synthetic && c_.run.eval_examples > 0) {
    const data::ExactMatchResult r = eval_exact_match(*model_, *synthetic, c_.run.eval_examples, groups_);
    m.accuracy = r.accuracy();
    m.num_correct = r.num_correct;
    m.num_examples = r.num_examples;
  }
  const bool accuracy_hit = c_.run.target_accuracy > 0 && m.accuracy && *m.accuracy >= c_.run.target_accuracy;
  const bool loss_hit = c_.run.target_loss > 0 && m.loss && *m.loss <= c_.run.target_loss;
  if (rank0()) {
    logger_->eval(m, record);
    shared_.outcome.last_eval = m;
    if ((accuracy_hit || loss_hit) && !shared_.outcome.target_reached) {
      shared_.outcome.target_reached = true;
      shared_.outcome.target_step = step;
    }
  }
  return accuracy_hit || loss_hit;
}

void RankTrainer::checkpoint(int64_t step) {
  // A checkpoint holds settled steps only: its optimizer step count is the applied steps' (must_read_back).
  CPF_CHECK(optimizer_->deferred_in_flight() == 0, "checkpoint at step ", step, ": ", optimizer_->deferred_in_flight(),
            " step(s) are not read back yet (a bug of the step window)");
  if (logger_) logger_->activity("checkpoint at step " + std::to_string(step));
  if (rank0()) {
    last_checkpoint_ = save_training_checkpoint(c_, params_, *optimizer_, step, loader_->cursor());
    shared_.outcome.checkpoint = last_checkpoint_;
    logger_->note("checkpoint " + last_checkpoint_);
  }
  groups_.world->barrier();
}

void RankTrainer::log_step(Session& s) {
  LogWindow& window = s.window;
  const double per_step = s.train_seconds / static_cast<double>(step_ - s.start);
  const double loss = window.loss / static_cast<double>(window.steps);
  logger_->step(StepMetrics{.step = step_,
                            .loss = loss,
                            .lr = schedule_.lr_at(step_ - 1),
                            .grad_norm = s.norm,
                            .tokens_per_second = window.tokens / std::max(window.seconds, 1e-9),
                            .tokens_seen = tokens_seen_,
                            .elapsed_seconds = seconds_since(s.t0),
                            .eta_seconds = per_step * static_cast<double>(c_.run.steps - step_),
                            .peak_memory_bytes = peak_memory(),
                            .resident_memory_bytes = resident_bytes(),
                            .mfu = mfu(window.tokens / std::max(window.seconds, 1e-9))},
                true);
  // The summary's train loss is this same quantity: the mean over the last step line's steps.
  shared_.outcome.train_loss = loss;
  shared_.outcome.train_loss_steps = window.steps;
  window = LogWindow{};
}

void RankTrainer::start_session() {
  resume();
  if (!c_.run.init_from.empty()) {
    // Fine-tuning starts from these weights; a resumed run continues its own (init_from.h).
    const std::string loaded = shared_.resume_path ? "" : load_init_weights(c_.run.init_from, c_, params_);
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
    training_step_deferred(step_parts(), step_, *window_);
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
    checkpoint(step_);
    s.saved_at = step_;
  }
  return stop;
}

void RankTrainer::finish(Session& s) {
  // A run that stopped at its target between step lines: its last steps get their line, so the
  // summary's train loss is a printed one.
  if (rank0() && s.window.steps > 0) log_step(s);
  // A finished run resumed again evaluates for its summary without recording that step twice.
  if (s.evaluated_at != step_) evaluate(step_, step_ != s.start || !shared_.resume_path);
  if (s.saved_at != step_) checkpoint(step_);
  if (rank0()) {
    shared_.outcome.final_step = step_;
    shared_.outcome.seconds = seconds_since(s.t0);
  }
}

void RankTrainer::run() {
  start_session();
  Session s;
  s.start = step_;
  s.saved_at = shared_.resume_path ? step_ : -1;  // the checkpoint we resumed from is this step's
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
      return stop_on_signal(signal, s.saved_at, seconds_since(s.t0));
    }
    stop = run_one_step(s, profile_window, profiler);
  }
  finish(s);
}

// The writing process draws loss.svg from the run's metrics.jsonl (resumed sessions included). The
// run itself succeeded: a plot that cannot be written is a warning line, not a failed run.
void write_loss_plot(std::optional<MetricsLogger>& logger, const std::string& dir) {
  if (!logger) return;
  try {
    write_run_plot(dir);
  } catch (const std::exception& e) {
    logger->note(std::string("warning: loss.svg not written: ") + e.what());
  }
}

}  // namespace

std::shared_ptr<const data::DocumentSource> open_training_source(const TrainConfig& config) {
  try {
    auto source = data::make_document_source(config.data);
    // A loader over it checks what the source alone cannot (e.g. that it holds any document).
    data::DataLoader probe(source, config.data, 0, config.parallel.dp);
    return source;
  } catch (const Error& e) {
    throw DataError(e.message());
  }
}

namespace {

// Started by torchrun / srun / mpirun (or dist::spawn_local_processes): this process is one rank, of a
// world of the config's size.
void check_launch_environment(const TrainConfig& config, const std::optional<dist::LaunchEnvironment>& env, int world) {
  if (!env) return;
  CPF_CHECK(config.parallel.backend == dist::Backend::nccl, "cpformer train was started by ", env->launcher,
            " as rank ", env->rank, " of ", env->world_size,
            ", but parallel.backend is thread (ranks as threads "
            "of one process); set parallel.backend: nccl (or --set parallel.backend=nccl)");
  CPF_CHECK(env->world_size == world, "cpformer train: the launcher started ", env->world_size,
            " processes but parallel.dp x parallel.cp = ", config.parallel.dp, " x ", config.parallel.cp, " = ", world,
            " ranks; make them equal");
}

Sources open_sources(const TrainConfig& config) {
  Sources sources;
  sources.train = open_training_source(config);
  try {
    sources.eval = make_eval_source(config, sources.train);
  } catch (const Error& e) {
    throw DataError("run.eval_path: " + e.message());
  }
  return sources;
}

// The writing process's logger, and its first line: the run's shape.
void start_logger(std::optional<MetricsLogger>& logger, const TrainConfig& config, std::ostream& out, bool progress_bar,
                  const Sources& sources, const std::optional<dist::LaunchEnvironment>& env) {
  const std::string dir = run_dir(config);
  const int world = static_cast<int>(config.parallel.dp * config.parallel.cp);
  logger.emplace(out, LoggerOptions{.metrics_path = (fs::path(dir) / "metrics.jsonl").string(),
                                    .train_log_path = (fs::path(dir) / "train.log").string(),
                                    .total_steps = config.run.steps,
                                    .progress_bar = progress_bar,
                                    .rank = 0,
                                    .heartbeat_seconds = progress_bar ? 0.0 : kHeartbeatSeconds});
  logger->note(
      "cpformer train: " + config.run.name + " | " + sources.train->name() + " | " + std::to_string(world) +
      " rank(s): dp=" + std::to_string(config.parallel.dp) + " cp=" + std::to_string(config.parallel.cp) +
      (config.parallel.cp > 1 ? " (" + cp::comm_type_name(config.parallel.cp_comm_type) + ")" : "") + ", " +
      dist::backend_name(config.parallel.backend) + (env ? " (" + env->launcher + ", one process per rank)" : "") +
      " | " + (rank_device_of(config, 0).is_cuda() ? "cuda" : "cpu") +
      (config.run.precision == PrecisionMode::bf16 ? " bf16 (f32 master weights)" : " fp32") + " | run folder " + dir);
}

}  // namespace

TrainOutcome train(const TrainConfig& config, std::ostream& out, bool progress_bar) {
  // The device check first: its message names run.device and the fix.
  const Device device0 = rank_device_of(config, 0);
  const int world = static_cast<int>(config.parallel.dp * config.parallel.cp);
  const std::optional<dist::LaunchEnvironment> env = dist::read_launch_environment();
  check_launch_environment(config, env, world);
  const bool writer = !env || env->rank == 0;  // the process that writes the run folder and logs
  const std::string dir = run_dir(config);
  const Sources sources = open_sources(config);
  // Ctrl-C / SIGTERM from here on stop the run between steps with a checkpoint.
  const StopSignalScope stop_signals;
  std::optional<RunFolderLock> lock;  // held until the run ends, however it ends
  std::optional<MetricsLogger> logger;
  if (writer) {
    lock.emplace(dir);
    apply_start_mode(config);
    start_logger(logger, config, out, progress_bar, sources, env);
  }

  Shared shared;
  shared.outcome.run_dir = dir;
  shared.outcome.target_set = config.run.target_accuracy > 0 || config.run.target_loss > 0;
  shared.process_per_rank = env.has_value();
  shared.outcome.reporter = writer;
  auto run_rank = [&](dist::RankContext& ctx) {
    MetricsLogger* rank_logger = ctx.rank == 0 && logger ? &*logger : nullptr;
    RankTrainer rank(config, ctx, shared, sources, rank_logger);
    if (rank_logger) {
      rank_logger->note("model: " + format_count(static_cast<double>(rank.num_parameters())) + " parameters, " +
                        std::to_string(config.model.num_layers) + " layers, hidden " +
                        std::to_string(config.model.hidden_size));
    }
    rank.run();
  };
  if (env) {
#if defined(CPF_WITH_OPENMP)
    // What launch() does for rank threads: the cores of this node shared by its ranks.
    const int local_ranks = std::max(1, env->local_world_size);
    omp_set_num_threads(config.run.threads > 0 ? static_cast<int>(config.run.threads)
                                               : std::max(1, omp_get_num_procs() / local_ranks));
#endif
#if CPF_HAVE_NCCL
    dist::RankContext ctx = dist::init_from_environment();
    try {
      run_rank(ctx);
    } catch (const std::exception& e) {
      // The other processes stop now, naming this rank and its message, instead of at their op timeout.
      dist::report_failure_to_peers(e.what());
      throw;
    }
#else
    CPF_FAIL("cpformer train: started by ", env->launcher, " (one process per rank) but this build has no NCCL ",
             "backend; rebuild with -DCPF_WITH_CUDA=ON -DCPF_WITH_NCCL=ON (docs/distributed.md)");
#endif
    write_loss_plot(logger, dir);
    return shared.outcome;
  }
  dist::LaunchOptions launch_options;
  launch_options.devices = device0.is_cuda() ? dist::DevicePolicy::cuda : dist::DevicePolicy::cpu;
  launch_options.omp_threads_per_rank = static_cast<int>(config.run.threads);
  launch_options.backend = config.parallel.backend;
  dist::launch(world, run_rank, launch_options);
  write_loss_plot(logger, dir);
  return shared.outcome;
}

}  // namespace cpf::trainer
