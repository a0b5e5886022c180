#pragma once
// The cross-field checks of a train config, run by load_train_config (config.h) after every key is read:
// options that mean nothing together (an fp8 key without run.precision: fp8), data and model that do not
// fit, context parallelism the model cannot run, names no folder can hold. Each refusal names the keys and
// their effective values. Resolves model.vocab_size from the data (0: take it) and run.out_dir's default.
#include "apps/config/config.h"
#include "framework/config/schema.h"

namespace cpf::trainer {

void check_train_config(const config::ConfigReader& reader, TrainConfig& c);

}  // namespace cpf::trainer
