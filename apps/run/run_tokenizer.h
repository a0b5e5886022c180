#pragma once
// The tokenizer of a run, recorded in its folder so `cpformer generate` encodes prompts and decodes
// output the way the model was trained, wherever the run folder is moved:
//
//   <run folder>/tokenizer.json    a copy of data.tokenizer when it names a Hugging Face file
//   <run folder>/tokenizer.model   a copy of data.tokenizer when it names a SentencePiece model
//
// The built-in tokenizers (bytes, gpt2) need no copy: config.yaml and every checkpoint's config name
// them. Shards made with another tokenizer name it in data.tokenizer (docs/data.md).
#include <memory>
#include <string>

#include "apps/config/config.h"
#include "models/data/tokenizer.h"

namespace cpf::trainer {

// Copies data.tokenizer's file into `run_dir` (atomically) when it names one; nothing otherwise.
// Throws cpf::Error naming both paths when the copy fails.
void record_run_tokenizer(const TrainConfig& config, const std::string& run_dir);

// The tokenizer of the model in `checkpoint` (whose effective config is `config`): the run folder's
// copy first (the checkpoint's grandparent, then run_dir(config)), else data.tokenizer as named.
// Throws for synthetic models (they have their own alphabet), for shards with no tokenizer, and when
// the file is found nowhere, naming where it looked and the fix.
std::shared_ptr<const models::data::Tokenizer> checkpoint_tokenizer(const std::string& checkpoint,
                                                                    const TrainConfig& config);

}  // namespace cpf::trainer
