#pragma once
// `cpformer export --format hf`: a checkpoint's weights as a Hugging Face model folder
// (apps/run/hf_folder.h writes it; apps/cli/export_command.cpp is the command).
#include <cstdint>
#include <optional>
#include <string>

#include "models/hf_weights.h"

namespace cpf::trainer {

struct HfExportResult {
  std::string checkpoint;  // the checkpoint folder exported
  std::string out_dir;
  int64_t step = 0;
  models::HfArchitecture arch = models::HfArchitecture::gpt2;
};

// Exports the newest checkpoint of `source` (a run folder, a folder of checkpoints or a checkpoint)
// into `out_dir` (default: the run folder's hf/). The checkpoint is validated first; the output folder
// must be new or empty. Throws Error naming the problem (a model shape with no HF architecture lists
// what each shape needs).
HfExportResult export_hf(const std::string& source, const std::optional<std::string>& out_dir);

}  // namespace cpf::trainer
