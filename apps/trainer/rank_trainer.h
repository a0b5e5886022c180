#pragma once
// RankTrainer: one rank's training run (private to apps/trainer; train() in trainer.cpp runs one per rank
// thread or process). rank_trainer.cpp builds it and holds what happens around the steps (resume, the
// run folder, signals, evaluation, checkpoints, step lines); rank_trainer_steps.cpp runs the steps
// (the loop, a step and its records, the read-back windows, the CUDA graph's start).
#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "apps/config/config.h"
#include "apps/report/device_memory.h"
#include "apps/report/device_peak.h"
#include "apps/report/metrics.h"
#include "apps/report/process_memory.h"
#include "apps/report/step_profiler.h"
#include "apps/run/checkpointing.h"
#include "apps/trainer/memory_plan.h"
#include "apps/trainer/step/step_graph.h"
#include "apps/trainer/step/step_prefetch.h"
#include "apps/trainer/step/step_window.h"
#include "apps/trainer/step/training_step.h"
#include "apps/trainer/trainer.h"
#include "framework/distributed/device_mesh.h"
#include "framework/distributed/grad_reducer.h"
#include "framework/distributed/launcher.h"
#include "framework/optim/optimizer_snapshot.h"
#include "models/model_flops.h"

namespace cpf::trainer {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// What the rank threads share. Rank 0 writes; a barrier separates every write from the reads.
struct Shared {
  std::optional<std::string> resume_path;
  TrainOutcome outcome;
  // One process per rank (torchrun/srun/mpirun): nothing is shared between ranks, each process finds
  // the checkpoint to resume itself and the ranks check that they agree.
  bool process_per_rank = false;
  // A rank's data source failed mid-run (models::data::DataReadError): train() reports it as a DataError (exit 3).
  std::atomic<bool> data_failed{false};
  // SIGINT/SIGTERM seen by a rank before its first step (setup: rank threads starting, models built,
  // groups joined): nothing to save, the rank leaves and the launcher aborts the others.
  std::atomic<int> setup_stop_signal{0};
};

// Throws (leaving the rank) when a stop signal arrived before training began: what keeps a start of many
// thread ranks responsive to Ctrl-C / SIGTERM. Records the signal in `shared`.
void leave_if_stopped_during_setup(Shared& shared);

struct Sources {
  std::shared_ptr<const models::data::DocumentSource> train, eval;
};

class RankTrainer {
 public:
  RankTrainer(const TrainConfig& config, dist::RankContext& ctx, Shared& shared, const Sources& sources,
              MetricsLogger* logger);

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
  // The memory planner's estimate for this run (memory_plan.h), beside the measured peak on GPUs.
  std::optional<double> memory_model() const {
    if (!device_.is_cuda()) return std::nullopt;
    return models::estimate_memory(memory_plan_input(c_)).total();
  }
  // Model FLOPs utilisation of the world's GPUs at `tokens_per_second` (all ranks' tokens): model FLOPs
  // (models/model_flops.h) over the dense bf16 peak of every GPU (device_peak.h); none on the CPU or an
  // unknown GPU.
  std::optional<double> mfu(double tokens_per_second) const {
    return utilisation(tokens_per_second, device_.is_cuda() ? dense_bf16_peak(device_) : std::nullopt);
  }
  // run.precision: fp8: the same FLOPs over the dense FP8 peak (as if every FLOP could run in FP8).
  std::optional<double> mfu_fp8(double tokens_per_second) const {
    if (c_.run.precision != PrecisionMode::fp8 || !device_.is_cuda()) return std::nullopt;
    return utilisation(tokens_per_second, dense_fp8_peak(device_));
  }
  std::optional<double> utilisation(double tokens_per_second, std::optional<double> peak) const {
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
  // Every process's checkpoint step all-reduced (min, max) and compared: refused, on every rank, unless equal.
  void agree_on_resume_step() const;
  // Weights, optimizer state (a sharded run: this rank's pieces), data cursor, log window and FP8 state.
  void load_resume(const std::string& path);
  // After a resume: the checkpoint's FP8 delayed-scaling state into the model's (or a note why not).
  void restore_fp8_scaling(const std::optional<std::string>& saved);
  void start_writing();     // the run folder's config.yaml and metrics.jsonl, once the start is accepted
  void start_step_graph();  // run.cuda_graph: the step graph, or why a GPU run has none
  int agreed_stop_signal();
  void stop_on_signal(int signal, int64_t saved_at, double seconds, const LogWindow& open_window);
  void check_nonfinite_steps(int64_t consecutive, double norm) const;
  StepParts step_parts();
  StepResult train_step(int64_t step);
  void train_step_deferred(int64_t step);  // training_step_deferred into window_
  // Rethrows `e` (in flight); a device out of memory with the planner's estimate added (memory_plan.h).
  [[noreturn]] void rethrow_out_of_memory(const Error& e, int64_t step) const;
  void note_skipped(int64_t step, const StepResult& r);  // rank 0; `step` 1-based
  bool evaluate(int64_t step, bool record = true);       // true when a target is reached
  // `open_window`: the steps since the last step line (rank 0's; the checkpoint carries them).
  void checkpoint(int64_t step, const LogWindow& open_window);
  // The state of one call of run(): where it started and what its loop has seen so far.
  struct Session {
    int64_t start = 0;
    Clock::time_point t0;
    double train_seconds = 0;
    LogWindow window;        // rank 0: the steps since the last step line, printed as one line (their mean loss)
    LogWindow partial_line;  // a line logged off the log_every grid (the run's end): the steps it covered
    int64_t saved_at = -1;   // the step of the newest checkpoint (the one resumed from counts)
    int64_t evaluated_at = -1;
    int64_t nonfinite_steps = 0;  // consecutive steps with a non-finite gradient norm
    double norm = 0;
    int64_t session_tokens = 0;  // this call's steps, for the progress bar's rate
    int64_t lines_logged = 0;    // step lines of this call
    int64_t steady_tokens = 0;   // the steps of every step line but the first: the summary's rate
    double steady_seconds = 0;
    Clock::time_point window_t0;  // when the first step in the step window began
  };
  void start_session();  // resume or init_from, the run folder's files, the accumulation note
  // What a checkpoint carries of the log: the steps since the last line on the log_every grid.
  LogWindow open_log_window(const Session& s) const;
  bool run_one_step(Session& s, const StepProfiler& profile_window, StepProfiler& profiler);
  void record_step(Session& s, const StepResult& r, double seconds);  // rank 0
  // The optimizer over the parameters, or over this rank's pieces of them when the state is sharded.
  std::unique_ptr<optim::Optimizer> build_optimizer() const;
  // Several ranks: the gradient reducer, and with parallel.shard the sharded state (ZeRO-3: one bucket per
  // unit of the model, and the model told to acquire its units).
  void build_reducer_and_shards();
  // The optimizer's state as a checkpoint holds it (the whole parameters' shapes, zero-stride views): what a
  // sharded run validates a checkpoint against before each rank reads its pieces.
  std::unique_ptr<optim::OptimizerSnapshot> checkpoint_state() const;
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
  std::unique_ptr<dist::ZeroShards> shards_;        // parallel.shard: the sharded state (zero_shards.h)
  std::unique_ptr<StepPrefetch> prefetch_;          // null on one rank
  std::unique_ptr<StepGraph> step_graph_;           // null: every step eager (step_graph.h)
  // One rank without run.profile: steps enqueued without a wait, read back when the host must (step_window.h).
  std::unique_ptr<StepWindow> window_;
  std::unique_ptr<models::data::DataLoader> loader_;
  int64_t step_ = 0;
  int64_t accum_steps_ = 1;                  // micro-batches per optimizer step
  int64_t tokens_seen_ = 0;                  // rank 0: training tokens of steps 1..step_, resumed sessions included
  std::optional<int64_t> tokens_at_start_;   // rank 0: from metrics.jsonl; nullopt when it does not tell
  std::optional<LogWindow> resumed_window_;  // the resumed checkpoint's open log window, when it carries one
  std::string last_checkpoint_;
};

}  // namespace cpf::trainer
