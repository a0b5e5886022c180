#pragma once
// One training step of one rank: how the rank takes part (RankGroups), the loss of one batch
// (batch_loss, also the held-out loss's), and the step itself (training_step): run.grad_accum_steps
// micro-batches forward and backward (grad_accumulation.h), the gradient norm and clipping, then the
// optimizer update, or no update when the norm is not finite.
//
// Host synchronisations of a step on cuda (docs/training.md, "Host synchronisation"): one. The gradient
// norm stays a device sum of squares that the clip and AdamW kernels read (clip or not, skip or not);
// the sum and the loss are copied to pinned memory with an event recorded before those kernels, and the
// host waits for that event only (StepReadback), counted by cuda::host_sync_counts() as a stream sync
// and logged per step under CPF_SYNC_CHECK=1. The optimizer's step count is committed after the wait.
// A one-rank run without run.profile takes training_step_deferred instead: no wait at all, the values
// read back for a window of steps at once (step_window.h).
// With several ranks the world's label count and the stop signal are agreed a step ahead and read at that
// same event (step_prefetch.h), so a step after a session's first also waits once.
#include <optional>

#include "apps/config/config.h"
#include "framework/distributed/grad_reducer.h"
#include "framework/distributed/process_group.h"
#include "framework/distributed/zero_shards.h"
#include "framework/optim/lr_schedule.h"
#include "framework/optim/optimizer.h"
#include "models/data/data_loader.h"
#include "models/gpt.h"

namespace cpf::trainer {

class StepPrefetch;
class StepGraph;
class StepWindow;

// How this rank takes part in a step.
struct RankGroups {
  dist::ProcessGroupPtr world;
  int64_t dp_rank = 0, dp_size = 1;
  int64_t cp_rank = 0, cp_size = 1;
  std::optional<cp::ContextParallel> cp;  // set when cp_size > 1
};

struct BatchLoss {
  Tensor loss;               // () this rank's share, on the model's device
  int64_t global_valid = 0;  // valid labels of the whole world
};

// This rank's share of the loss of a step whose DP rank holds `batch`: the summed token loss of its
// CP shard divided by the valid-label count of the whole world, so the sum over ranks is the mean.
BatchLoss batch_loss(const models::GPT& model, const models::data::Batch& batch, const RankGroups& groups);

// What a step works on; the trainer owns every part.
struct StepParts {
  const models::GPT& model;
  models::data::DataLoader& loader;
  const RankGroups& groups;
  dist::GradientReducer* reducer;  // null on one rank
  const optim::NamedTensors& params;
  optim::Optimizer& optimizer;
  const optim::LrSchedule& schedule;
  int64_t accum_steps = 1;  // micro-batches per step
  double grad_clip = 0;     // run.grad_clip; 0: no clipping
  // Several ranks: the next step's micro-batches, label count and stop signal agreed inside this step
  // (step_prefetch.h); null: this step counts its labels with a blocking all-reduce (one rank: none).
  StepPrefetch* prefetch = nullptr;
  // One GPU: the forward and backward captured once and replayed (step_graph.h); null: eager.
  StepGraph* graph = nullptr;
  // parallel.shard: the optimizer updates this rank's pieces, then the parameters are gathered whole
  // (framework/distributed/zero_shards.h); null: replicated.
  dist::ZeroShards* shards = nullptr;
};

struct StepResult {
  double loss = 0;       // mean token loss of the step over the world
  double grad_norm = 0;  // before clipping
  int64_t tokens = 0;    // storage tokens of the step over the world
  bool skipped = false;  // the norm was not finite: no update, no step count (the gradients are zeroed all the same)
};

// Step `step` (0-based: the learning rate is the schedule's at `step`). Every rank calls it.
StepResult training_step(const StepParts& parts, int64_t step);

// run.precision: fp8, delayed scaling, several ranks (collective over `world`): every rank made the same FP8
// call sites in the same order (their keys' counts and fingerprints agree), or the amax all-reduce would
// mix unrelated tensors: throws on every rank otherwise. Run once whenever slots were added (the step does).
void check_same_fp8_sites(dist::ProcessGroup& world, Fp8ScalingState& state, Device device);

// One rank: step `step` enqueued without reading anything back. Its sum of squares and loss go into the
// window's next slot and the optimizer takes it as a deferred step (Optimizer::step_deferred); the caller
// reads the window later (StepWindow::read) and settles the optimizer with the outcomes, in order. Throws
// with parts.prefetch set (several ranks read every step back).
void training_step_deferred(const StepParts& parts, int64_t step, StepWindow& window);

}  // namespace cpf::trainer
