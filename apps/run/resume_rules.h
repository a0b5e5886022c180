#pragma once
// What `run.resume: auto` accepts, and how it explains what it refuses. Everything here runs before the
// run folder is written to: a refused resume leaves config.yaml, metrics.jsonl and the checkpoints as
// they were.
//
//   - A checkpoint of another config (the keys its hash covers: run.seed, model, optimizer, schedule,
//     data) is refused with every differing key and both values, not two hashes.
//   - run.steps below the checkpoint's step is refused (there is nothing to train, and "done: step
//     400/100" would be a wrong answer).
//   - A learning-rate schedule that changed since the checkpoint (schedule.total_steps: 0 follows
//     run.steps, so raising run.steps moves the decay) is reported with the learning rate the saved run
//     would have used at the next step and the one this run uses, and how to keep the saved schedule.
#include <cstdint>
#include <optional>
#include <string>

#include "apps/config/config.h"

namespace cpf::trainer {

// "model.hidden_size: 32 in the checkpoint, 64 now; data.seed: ..." over the keys of the config hash;
// empty when they all agree.
std::string config_differences(const TrainConfig& saved, const TrainConfig& current);

// Why resuming from the run folder's newest checkpoint is refused when its config differs from
// `current` (the differing keys, the fix), or nullopt when it does not differ or has no readable
// config. Called when no checkpoint of the folder can be loaded.
std::optional<std::string> explain_config_mismatch(const TrainConfig& current);

// Throws when the run resumed at `step` has fewer than `step` steps in all (run.steps).
void check_resume_step(const TrainConfig& config, int64_t step, const std::string& checkpoint);

// A warning when the learning rate of step `step` + 1 under `current` differs from the one the
// checkpoint's own config gives (`saved`); nullopt when the schedule continues unchanged.
std::optional<std::string> schedule_change_warning(const TrainConfig& saved, const TrainConfig& current, int64_t step);

}  // namespace cpf::trainer
