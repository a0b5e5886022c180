#pragma once
// A Hugging Face model folder: config.json and model.safetensors (with __metadata__ {"format": "pt"}),
// the layout transformers' from_pretrained reads. models/hf_weights.h maps the tensor names and
// layouts; this file writes and checks config.json (docs/checkpoints.md lists every key).
#include <string>

#include "framework/io/safetensors.h"
#include "models/gpt.h"
#include "models/hf_weights.h"

namespace cpf::trainer {

inline constexpr const char* kHfConfigFile = "config.json";
inline constexpr const char* kHfWeightsFile = "model.safetensors";

// True when `path` is a folder holding config.json and model.safetensors.
bool is_hf_folder(const std::string& path);

// config.json of a GPT of `model` as `arch` (architectures, model_type and every dimension).
std::string hf_config_json(const models::GPTOptions& model, models::HfArchitecture arch);

// Writes config.json and model.safetensors of `params` (the model's named parameters) into `dir`,
// which must not exist or be empty (nothing is overwritten). Throws naming the shape problem when the
// model matches neither HF architecture. Returns the architecture written.
models::HfArchitecture write_hf_folder(const std::string& dir, const models::GPTOptions& model,
                                       const io::NamedTensors& params);

// The weights of the HF folder `dir` as cpformer tensors of `params`' names, shapes and dtypes. First
// checks config.json against `model` key by key (e.g. "n_embd 768 but model.hidden_size is 128; set
// model.hidden_size: 768"), then every tensor name and shape (models::from_hf_weights).
io::NamedTensors read_hf_folder(const std::string& dir, const models::GPTOptions& model,
                                const io::NamedTensors& params);

}  // namespace cpf::trainer
