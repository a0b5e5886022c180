#pragma once
// The training loop behind `cpformer train`.
//
// The world is parallel.dp x parallel.cp thread ranks (dist::launch), arranged by a DeviceMesh. Every
// rank holds a full model replica built from the same seed. Per step, each DP rank takes its own
// global batch from the loader, each CP rank its dual-chunk shard of it; every attention layer runs
// the configured CP strategy. Ranks compute on run.device (cuda: GPU r % visible GPUs; the model is
// drawn on the CPU from the seed and moved there) in run.precision (bf16: mixed precision over f32
// master weights, docs/training.md). The loss is the mean over the valid tokens of the whole step:
// each rank scales its summed token loss by 1 / (valid tokens over all DP x CP ranks) and gradients
// are summed over the world, so any (dp, cp) takes the same step as one rank with the same global batch.
//
// Rank 0 prints, writes metrics.jsonl and config.yaml, and saves checkpoints; resume: auto continues
// from the newest valid checkpoint (weights, optimizer state, data cursor), reproducing the
// uninterrupted run bit for bit. The writing process holds the run folder's lock (run_folder.h) for the
// whole run and writes nothing there before a resume is accepted (resume_rules.h). SIGINT / SIGTERM
// stop the run between steps with a checkpoint (stop_signals.h); run.max_nonfinite_steps consecutive
// steps with a non-finite gradient norm stop it with an error.
#include <memory>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "apps/config/config.h"
#include "apps/report/metrics.h"
#include "framework/core/error.h"
#include "models/data/document_source.h"

namespace cpf::trainer {

// A data source that cannot be opened or read (missing, empty or malformed files): exit code 3. A
// cpf::Error whose what() is the message alone (it names the file); the CLI catches it before Error.
class DataError : public Error {
 public:
  explicit DataError(const std::string& message) : Error("", 0, "", message) {}
  const char* what() const noexcept override { return message().c_str(); }
};

struct TrainOutcome {
  std::string run_dir;
  int64_t start_step = 0;  // > 0 when resumed
  int64_t final_step = 0;
  std::vector<double> losses;  // training loss of each step this call ran (steps start_step+1 ...)
  // The loss of the last step line: the mean over its train_loss_steps steps (what the summary shows).
  std::optional<double> train_loss;
  int64_t train_loss_steps = 0;
  int64_t tokens_seen = 0;  // training tokens of steps 1..final_step, resumed sessions included
  std::optional<EvalMetrics> last_eval;
  bool target_set = false;
  bool target_reached = false;
  int64_t target_step = 0;
  double seconds = 0;
  // This call's training steps: their tokens (all ranks') over their wall time (the steps after the first
  // step line when there are more), and the model FLOPs utilisation at that rate (GPU runs on a known GPU
  // only). Unset when no step ran.
  std::optional<double> tokens_per_second;
  std::optional<double> mfu;
  std::optional<double> mfu_fp8;  // run.precision: fp8: the same FLOPs over the GPU's dense FP8 peak
  std::string checkpoint;         // the last checkpoint written
  // SIGINT or SIGTERM when the run stopped early on it (after a final checkpoint, unless no step ran); 0 otherwise.
  int stop_signal = 0;
  // false in the processes of ranks > 0 under a launcher (torchrun/srun/mpirun): rank 0's process
  // reports the run; the others only say whether they finished without error.
  bool reporter = true;
};

// Opens the training source of `config` (throws DataError naming the problem).
std::shared_ptr<const models::data::DocumentSource> open_training_source(const TrainConfig& config);

// Runs the whole job. `out` receives the log lines; `progress_bar` draws a bar between them (use it
// only when `out` is a terminal). Throws DataError for unreadable data and cpf::Error otherwise.
TrainOutcome train(const TrainConfig& config, std::ostream& out, bool progress_bar = false);

}  // namespace cpf::trainer
