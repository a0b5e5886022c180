// RankTrainer's construction and what happens around the steps (rank_trainer.h).
#include "apps/trainer/rank_trainer.h"

#include <cmath>
#include <filesystem>

#include "apps/report/checked_file.h"
#include "apps/run/checkpointing.h"
#include "apps/run/collective_phase.h"
#include "apps/run/resume_rules.h"
#include "apps/run/run_folder.h"
#include "apps/run/run_tokenizer.h"
#include "apps/trainer/evaluation.h"
#include "apps/trainer/step/grad_accumulation.h"
#include "apps/trainer/stop_signals.h"

namespace cpf::trainer {
namespace fs = std::filesystem;
namespace {

// The rank's model replica: drawn on the CPU from the run seed (the same on every rank and device), then
// moved to the rank's device, so CPU and GPU runs start from identical weights.
std::unique_ptr<models::GPT> make_model(const TrainConfig& c, Generator* gen, Device device) {
  auto model = std::make_unique<models::GPT>(model_options(c), gen);
  model->to(device);
  return model;
}

// The parameter groups of `params` as the optimizer of `c` forms them (weight decay or none).
std::vector<optim::ParamGroup> optimizer_groups(const TrainConfig& c, const optim::NamedTensors& params) {
  return optim::weight_decay_groups(params, c.optimizer.weight_decay, c.optimizer.decay_all);
}

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& c, std::vector<optim::ParamGroup> groups) {
  const OptimizerOptions& o = c.optimizer;
  if (o.type == OptimizerType::sgd) {
    return std::make_unique<optim::SGD>(std::move(groups), optim::SGDOptions{.lr = o.lr,
                                                                             .momentum = o.momentum,
                                                                             .nesterov = o.nesterov,
                                                                             .weight_decay = o.weight_decay,
                                                                             .decay_all = o.decay_all});
  }
  return std::make_unique<optim::AdamW>(std::move(groups), optim::AdamWOptions{.lr = o.lr,
                                                                               .beta1 = o.beta1,
                                                                               .beta2 = o.beta2,
                                                                               .eps = o.eps,
                                                                               .weight_decay = o.weight_decay,
                                                                               .decay_all = o.decay_all});
}

}  // namespace

RankTrainer::RankTrainer(const TrainConfig& config, dist::RankContext& ctx, Shared& shared, const Sources& sources,
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
    build_reducer_and_shards();
    prefetch_ = std::make_unique<StepPrefetch>(pending_stop_signal);  // step_prefetch.h
  } else if (config.run.profile == 0) {
    window_ = std::make_unique<StepWindow>(device_);  // steps read back in windows (step_window.h)
  }
  optimizer_ = build_optimizer();
  loader_ = std::make_unique<models::data::DataLoader>(sources.train, config.data, groups_.dp_rank, groups_.dp_size);
  accum_steps_ = grad_accum_steps(config);
}

void RankTrainer::build_reducer_and_shards() {
  const dist::ShardStage stage = c_.parallel.shard;
  dist::GradientReducerOptions options{
      .op = dist::ReduceOp::sum,
      .shard_gradients = stage == dist::ShardStage::gradients || stage == dist::ShardStage::parameters};
  std::vector<size_t> unit_buckets;
  if (stage == dist::ShardStage::parameters) {
    // One bucket per unit, in the order the backward completes them: the last block first, the root (its
    // tied embedding's gradient comes last) at the end. Unit u of the model is then bucket unit_buckets[u].
    const std::vector<std::vector<size_t>> units = model_->parameter_units();  // blocks 0..L-1, then the root
    const size_t blocks = units.size() - 1;
    for (size_t i = blocks; i-- > 0;) options.buckets.push_back(units[i]);
    options.buckets.push_back(units[blocks]);
    for (size_t u = 0; u < blocks; ++u) unit_buckets.push_back(blocks - 1 - u);
    unit_buckets.push_back(blocks);
  }
  reducer_ = std::make_unique<dist::GradientReducer>(tensors_, groups_.world, options);
  if (stage == dist::ShardStage::none) return;
  shards_ = std::make_unique<dist::ZeroShards>(params_, reducer_->buckets(), groups_.world, stage, unit_buckets);
  if (stage == dist::ShardStage::parameters) model_->set_parameter_units(shards_.get());
}

std::unique_ptr<optim::Optimizer> RankTrainer::build_optimizer() const {
  const std::vector<optim::ParamGroup> groups = optimizer_groups(c_, params_);
  return make_optimizer(c_, shards_ ? shards_->piece_groups(groups) : groups);
}

std::unique_ptr<optim::OptimizerSnapshot> RankTrainer::checkpoint_state() const {
  return optim::OptimizerSnapshot::zeros_for(optimizer_->name(), optimizer_groups(c_, params_),
                                             optimizer_->state_slots(), /*allocate=*/false);
}

void RankTrainer::resume() {
  if (c_.run.resume != ResumeMode::auto_resume) return;  // never / replace start over (apply_start_mode)
  if (rank0() || shared_.process_per_rank) {
    try {
      shared_.resume_path = find_resume_checkpoint(c_, params_, shards_ ? *checkpoint_state() : *optimizer_);
    } catch (const Error&) {
      // A checkpoint of another config: name the keys that differ instead of two hashes.
      if (auto why = explain_config_mismatch(c_)) CPF_FAIL(*why);
      throw;
    }
  }
  groups_.world->barrier();
  // Before any collective of the load: every process must resume from the same step (a run folder that
  // is not on a shared filesystem would silently restart some ranks from scratch, or leave them waiting).
  if (shared_.process_per_rank) agree_on_resume_step();
  if (shared_.resume_path) load_resume(*shared_.resume_path);
  if (!shared_.resume_path || !logger_) return;
  logger_->note("resumed from " + *shared_.resume_path + " at step " + std::to_string(step_));
  const TrainConfig saved = checkpoint_config(*shared_.resume_path);
  if (auto warning = schedule_change_warning(saved, c_, step_)) logger_->note(*warning);
}

void RankTrainer::agree_on_resume_step() const {
  const double found =
      shared_.resume_path ? static_cast<double>(io::read_checkpoint_meta(*shared_.resume_path).step) : 0;
  const Tensor mine = full({1}, found, {.dtype = DType::f64, .device = device_});
  const double lo = groups_.world->all_reduce(mine, dist::ReduceOp::min).item<double>();
  const double hi = groups_.world->all_reduce(mine, dist::ReduceOp::max).item<double>();
  CPF_CHECK(lo == hi, "resume: the ranks found different checkpoints (steps ", lo, " to ", hi, "); the run folder ",
            run_dir(c_), " must be on a filesystem every rank sees, or set run.resume: replace");
}

void RankTrainer::load_resume(const std::string& path) {
  ResumeState state;
  if (shards_) {
    // Each rank reads only its pieces of the weights and the state (of any layout and world size), then
    // the parameters are made whole from the pieces, a collective: every rank learns first whether every
    // load succeeded, so a rank whose read failed fails them all instead of leaving them waiting.
    run_collective_phase(
        *groups_.world, device_, true,
        [&] { state = load_training_checkpoint_pieces(path, c_, shards_->pieces(), *optimizer_); },
        "resume: loading " + path + " failed on another rank (its log names why)");
    shards_->pieces_loaded();
  } else {
    state = load_training_checkpoint(path, c_, params_, *optimizer_);
  }
  check_resume_step(c_, state.step, path);
  loader_->set_cursor(state.cursor);
  step_ = state.step;
  // Steps the checkpoint's run had not logged on the log_every grid (none when it stopped on a line of it).
  if (state.carried && state.window.steps > 0) resumed_window_ = state.window;
  restore_fp8_scaling(state.fp8_scaling);
}

void RankTrainer::restore_fp8_scaling(const std::optional<std::string>& saved) {
  Fp8ScalingState* state = model_->fp8_scaling();
  if (state != nullptr && saved) {
    state->restore(*saved);  // the scales and amax histories the uninterrupted run would cast with
  } else if (state != nullptr && logger_) {
    logger_->note(
        "fp8: the checkpoint holds no delayed-scaling state (another precision or recipe); the scales "
        "start over from the first step's amaxes");
  } else if (saved && logger_) {
    logger_->note("fp8: the checkpoint's delayed-scaling state is not used (this run: " +
                  std::string(c_.run.precision == PrecisionMode::fp8 ? "fp8.recipe: current" : "no FP8") + ")");
  }
}

void RankTrainer::start_writing() {
  if (!logger_) return;  // only the writing process's rank 0 has a logger
  const std::string yaml = "# Effective config of this run (written by cpformer train; defaults filled in).\n";
  write_file_atomically((fs::path(run_dir(c_)) / "config.yaml").string(), yaml + to_yaml(c_));
  record_run_tokenizer(c_, run_dir(c_));  // generate finds data.tokenizer's file here (run_tokenizer.h)
  // A checkpoint that carries its open log window: the row a stopped run wrote for those steps (off the
  // log_every grid) goes, and the next line covers them again; the tokens count them.
  tokens_at_start_ = logger_->start_metrics(step_, resumed_window_.has_value());
  if (tokens_at_start_ && resumed_window_) *tokens_at_start_ += resumed_window_->tokens;
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

void RankTrainer::stop_on_signal(int signal, int64_t saved_at, double seconds, const LogWindow& open_window) {
  const bool save = step_ > 0 && saved_at != step_;
  if (save) checkpoint(step_, open_window);
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
                   .graph = step_graph_.get(),
                   .shards = shards_.get()};
}

void RankTrainer::note_skipped(int64_t step, const StepResult& r) {
  if (r.skipped && rank0()) {
    logger_->note("step " + std::to_string(step) + ": gradient norm " + std::to_string(r.grad_norm) +
                  ", update skipped");
  }
}

StepResult RankTrainer::train_step(int64_t step) {
  try {
    const StepResult r = training_step(step_parts(), step);
    note_skipped(step + 1, r);
    return r;
  } catch (const Error& e) {
    rethrow_out_of_memory(e, step);
  }
}

void RankTrainer::train_step_deferred(int64_t step) {
  try {
    training_step_deferred(step_parts(), step, *window_);
  } catch (const Error& e) {
    rethrow_out_of_memory(e, step);
  }
}

void RankTrainer::rethrow_out_of_memory(const Error& e, int64_t step) const {
  if (const std::optional<std::string> note = out_of_memory_note(e, c_)) {
    throw Error(e.file(), e.line(), e.condition(),
                "step " + std::to_string(step + 1) + ": " + e.message() + "; " + *note);
  }
  throw;
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
  if (shards_) shards_->release_all();  // sharded parameters: the root the forwards kept
  if (const models::data::SyntheticSource* synthetic = loader_->synthetic(); synthetic && c_.run.eval_examples > 0) {
    // Each rank predicts its own examples (a different number of forwards): sharded parameters stay whole.
    if (shards_) shards_->acquire_all();
    const models::data::ExactMatchResult r = eval_exact_match(*model_, *synthetic, c_.run.eval_examples, groups_);
    if (shards_) shards_->release_all();
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

void RankTrainer::checkpoint(int64_t step, const LogWindow& open_window) {
  // A checkpoint holds settled steps only: its optimizer step count is the applied steps' (must_read_back).
  CPF_CHECK(optimizer_->deferred_in_flight() == 0, "checkpoint at step ", step, ": ", optimizer_->deferred_in_flight(),
            " step(s) are not read back yet (a bug of the step window)");
  if (logger_) logger_->activity("checkpoint at step " + std::to_string(step));
  const std::string fp8 = model_->fp8_scaling() ? model_->fp8_scaling()->serialize() : "";  // the same on every rank
  if (shards_ && groups_.world->size() > 1) {
    // Sharded: every rank writes its own pieces in parallel; nothing is gathered (sharded_checkpoint.h).
    const std::string path = save_sharded_training_checkpoint(c_, *groups_.world, shards_->pieces(), *optimizer_, step,
                                                              loader_->cursor(), open_window, device_, fp8);
    if (rank0()) {
      last_checkpoint_ = path;
      shared_.outcome.checkpoint = last_checkpoint_;
      logger_->note("checkpoint " + last_checkpoint_ + " (" + std::to_string(groups_.world->size()) +
                    " shards, written in parallel)");
    }
    return;
  }
  // Replicated: rank 0 writes the whole state.
  const optim::NamedTensors whole = shards_ ? shards_->full_state(*optimizer_) : optim::NamedTensors{};
  if (shards_) shards_->acquire_all();  // sharded parameters: whole while rank 0 writes them
  if (rank0()) {
    std::unique_ptr<optim::OptimizerSnapshot> snapshot;
    if (shards_) {
      snapshot = std::make_unique<optim::OptimizerSnapshot>(optimizer_->name(), optimizer_groups(c_, params_),
                                                            optimizer_->state_slots(), whole, optimizer_->step_count());
    }
    last_checkpoint_ = save_training_checkpoint(c_, params_, snapshot ? *snapshot : *optimizer_, step,
                                                loader_->cursor(), open_window, fp8);
    shared_.outcome.checkpoint = last_checkpoint_;
    logger_->note("checkpoint " + last_checkpoint_);
  }
  groups_.world->barrier();
  if (shards_) shards_->release_all();
}

void RankTrainer::log_step(Session& s) {
  LogWindow& window = s.window;
  const double per_step = s.train_seconds / static_cast<double>(step_ - s.start);
  const double loss = window.loss / static_cast<double>(window.steps);
  logger_->step(
      StepMetrics{.step = step_,
                  .loss = loss,
                  .lr = schedule_.lr_at(step_ - 1),
                  .grad_norm = s.norm,
                  .tokens_per_second = window.tokens / std::max(window.seconds, 1e-9),
                  .tokens_seen = tokens_seen_,
                  .elapsed_seconds = seconds_since(s.t0),
                  .eta_seconds = per_step * static_cast<double>(c_.run.steps - step_),
                  .peak_memory_bytes = peak_memory(),
                  .memory_model_bytes = memory_model(),
                  .resident_memory_bytes = resident_bytes(),
                  .mfu = mfu(window.tokens / std::max(window.seconds, 1e-9)),
                  .mfu_fp8 = mfu_fp8(window.tokens / std::max(window.seconds, 1e-9)),
                  .fp8_clipped = model_->fp8_scaling() ? std::optional<int64_t>(model_->fp8_scaling()->take_clipped())
                                                       : std::nullopt},
      true);
  // The summary's train loss is this same quantity: the mean over the last step line's steps.
  shared_.outcome.train_loss = loss;
  shared_.outcome.train_loss_steps = window.steps;
  // A line off the log_every grid (the run's end) leaves its steps open for a resumed run's next line.
  s.partial_line = step_ % c_.run.log_every == 0 ? LogWindow{} : window;
  // The summary's rate leaves the session's first line out when there are more: it holds the one-time setup
  // (cuDNN plans, the CUDA graph's capture, the allocator's first allocations).
  if (s.lines_logged++ > 0) {
    s.steady_tokens += window.tokens;
    s.steady_seconds += window.seconds;
  }
  window = LogWindow{};
}

}  // namespace cpf::trainer
