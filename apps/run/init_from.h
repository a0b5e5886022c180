#pragma once
// run.init_from: the starting weights of a run (fine-tuning) instead of a random initialisation.
//
// PATH is a cpformer checkpoint (a checkpoint folder, a folder of step_* checkpoints or a run folder:
// the newest complete checkpoint) or a Hugging Face folder (config.json + model.safetensors of the
// GPT-2 or Llama shape, as `cpformer export --format hf` writes and transformers saves). Only the
// weights are taken: optimizer state, learning-rate schedule and data position start fresh. A run that
// resumes from its own checkpoint (run.resume: auto) continues those weights and ignores init_from.
//
// Every mismatch is refused before a weight changes, naming it: the model: keys that differ from the
// checkpoint's config (e.g. "model.norm: layernorm in the checkpoint, rmsnorm now"), the config.json
// key that differs from a model: key, an absent, extra or differently shaped tensor.
#include <string>

#include "apps/config/config.h"
#include "framework/optim/optimizer.h"

namespace cpf::trainer {

// Copies the weights of `path` into `params` (the model of `config`, on any device). Returns what was
// loaded, for the run's log ("init_from: <checkpoint> (cpformer checkpoint, step 400)"). Throws Error.
std::string load_init_weights(const std::string& path, const TrainConfig& config, const optim::NamedTensors& params);

}  // namespace cpf::trainer
