#pragma once
// Checkpoint glue between the trainer and framework/io/checkpoint.h.
//
//   <run folder>/checkpoints/step_00000400/{model,optimizer}.safetensors, meta.json
//   (a sharded run of W ranks: {model,optimizer}.shard-0000r-of-0000W.safetensors, written by every rank in
//   parallel: framework/io/sharded_checkpoint.h, RankTrainer::checkpoint)
//
// meta.json's `extra` carries the data loader's cursor ("epoch=0 index=1234 offset=0"), the effective
// config (YAML), so `cpformer generate` needs nothing but the checkpoint folder, and the steps since the
// last step line (`log_window`), so a resumed run's next line averages the steps an uninterrupted run's
// would. Under run.precision: fp8 with fp8.recipe: delayed it also carries the FP8 scaling state
// (`fp8_scaling`: every scale and amax history as exact bits), so a resumed run casts as the uninterrupted one.
// The config hash covers what gives the weights and the data stream their meaning (model, data, optimizer,
// schedule, run.seed); resume refuses a checkpoint of another config instead of silently restarting.
#include <optional>
#include <string>

#include "apps/config/config.h"
#include "framework/distributed/process_group.h"
#include "framework/io/checkpoint.h"
#include "models/data/data_order.h"

namespace cpf::trainer {

std::string checkpoints_dir(const TrainConfig& config);
std::string config_hash(const TrainConfig& config);

// The checkpoint to resume from under `resume: auto`: the newest valid one, nullopt when the folder
// has none. Throws when checkpoints exist but none can be loaded (e.g. another config), naming why.
std::optional<std::string> find_resume_checkpoint(const TrainConfig& config, const optim::NamedTensors& params,
                                                  const optim::Optimizer& optimizer);

// The steps since the last step line: their summed loss, tokens and seconds (what the next line averages).
struct LogWindow {
  double seconds = 0, loss = 0;
  int64_t tokens = 0, steps = 0;
};

struct ResumeState {
  int64_t step = 0;
  models::data::DataCursor cursor;
  // The checkpoint's open log window; `carried` false for a checkpoint written before it was recorded.
  LogWindow window;
  bool carried = false;
  // run.precision: fp8 with delayed scaling: the scaling state (Fp8ScalingState::serialize), when saved.
  std::optional<std::string> fp8_scaling;
};
// Loads weights and optimizer state (validated first; nothing changes on failure).
ResumeState load_training_checkpoint(const std::string& path, const TrainConfig& config,
                                     const optim::NamedTensors& params, optim::Optimizer& optimizer);
// A sharded run (parallel.shard): every rank reads only its pieces (ZeroShards::pieces()) and the state of
// its optimizer over them, from a checkpoint of any layout and world size (io::load_checkpoint_pieces);
// no rank holds the whole model or state. Check the checkpoint against the whole model first
// (find_resume_checkpoint does).
ResumeState load_training_checkpoint_pieces(const std::string& path, const TrainConfig& config,
                                            const optim::NamedTensors& pieces, optim::Optimizer& optimizer);

// Writes step `step` atomically and prunes to run.keep_checkpoints; returns its folder.
std::string save_training_checkpoint(const TrainConfig& config, const optim::NamedTensors& params,
                                     const optim::Optimizer& optimizer, int64_t step,
                                     const models::data::DataCursor& cursor, const LogWindow& open_window = {},
                                     const std::string& fp8_scaling = "");

// Collective over `group` (the sharded state's, every rank): each rank writes its pieces of the parameters
// (`pieces`: ZeroShards::pieces()) and of the optimizer state (over those pieces) into step `step`'s
// checkpoint, in parallel, and rank 0 publishes it (framework/io/sharded_checkpoint.h). A failure on any
// rank fails every rank and publishes nothing. Returns the folder on rank 0 ("" elsewhere).
std::string save_sharded_training_checkpoint(const TrainConfig& config, dist::ProcessGroup& group,
                                             const optim::NamedTensors& pieces, const optim::Optimizer& optimizer,
                                             int64_t step, const models::data::DataCursor& cursor,
                                             const LogWindow& open_window, Device device,
                                             const std::string& fp8_scaling = "");

// The metadata of step `step`'s checkpoint (config hash, data cursor, effective config, open log window).
io::CheckpointMeta training_checkpoint_meta(const TrainConfig& config, int64_t step,
                                            const models::data::DataCursor& cursor, const LogWindow& open_window = {},
                                            const std::string& fp8_scaling = "");

// For generate: `dir` may be a checkpoint (holding meta.json), a folder of step_* checkpoints, or a run
// folder (its checkpoints/). Returns the checkpoint folder to load (the newest complete one).
std::string resolve_checkpoint(const std::string& dir);
// The effective config stored in a checkpoint's metadata.
TrainConfig checkpoint_config(const std::string& checkpoint);

}  // namespace cpf::trainer
