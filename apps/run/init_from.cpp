#include "apps/run/init_from.h"

#include <filesystem>

#include "apps/run/checkpointing.h"
#include "apps/run/hf_folder.h"
#include "apps/run/resume_rules.h"
#include "framework/autograd/ops.h"
#include "framework/io/checkpoint.h"
#include "framework/tensor/ops/copy.h"

namespace cpf::trainer {
namespace fs = std::filesystem;
namespace {

// The model: keys (those that change the computed function) where the checkpoint's config differs.
std::string model_differences(const TrainConfig& saved, const TrainConfig& current) {
  TrainConfig before = current;
  before.model = saved.model;
  before.model.init_std = current.model.init_std;  // the initialisation does not matter to loaded weights
  return config_differences(before, current);
}

std::string load_cpformer_checkpoint(const std::string& path, const TrainConfig& config,
                                     const optim::NamedTensors& params) {
  const std::string checkpoint = resolve_checkpoint(path);
  const TrainConfig saved = checkpoint_config(checkpoint);
  const std::string differences = model_differences(saved, config);
  CPF_CHECK(differences.empty(), checkpoint, " holds another model: ", differences,
            ". Set the model: section to the checkpoint's");
  const io::CheckpointMeta meta = io::load_checkpoint(checkpoint, params, nullptr, "");
  return checkpoint + " (cpformer checkpoint, step " + std::to_string(meta.step) + ")";
}

std::string load_hf(const std::string& path, const TrainConfig& config, const optim::NamedTensors& params) {
  const io::NamedTensors weights = read_hf_folder(path, config.model, params);
  NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& live = params[i].second;
    copy_(live, raw::to(weights[i].second, live.device()));
  }
  return path + " (Hugging Face folder)";
}

}  // namespace

std::string load_init_weights(const std::string& path, const TrainConfig& config, const optim::NamedTensors& params) {
  std::error_code ec;
  CPF_CHECK(fs::exists(path, ec), "run.init_from: ", path,
            " does not exist (expected a cpformer checkpoint or run folder, or a Hugging Face folder with ",
            kHfConfigFile, " and ", kHfWeightsFile, ")");
  try {
    return is_hf_folder(path) ? load_hf(path, config, params) : load_cpformer_checkpoint(path, config, params);
  } catch (const config::ConfigError&) {
    throw;  // the checkpoint's saved config is unreadable: its own located message, unprefixed
  } catch (const Error& e) {
    CPF_FAIL("run.init_from: ", e.message());
  }
}

}  // namespace cpf::trainer
