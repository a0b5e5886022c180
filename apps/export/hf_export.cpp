#include "apps/export/hf_export.h"

#include <filesystem>

#include "apps/run/checkpointing.h"
#include "apps/run/hf_folder.h"
#include "framework/core/error.h"
#include "framework/io/checkpoint.h"
#include "models/gpt.h"

namespace cpf::trainer {
namespace fs = std::filesystem;

HfExportResult export_hf(const std::string& source, const std::optional<std::string>& out_dir) {
  HfExportResult r;
  r.checkpoint = resolve_checkpoint(source);
  const fs::path checkpoints = fs::path(r.checkpoint).parent_path();
  if (out_dir) {
    r.out_dir = *out_dir;
  } else {
    // The run folder's hf/ when the checkpoint is one of a run's; elsewhere the caller must say.
    CPF_CHECK(checkpoints.filename() == "checkpoints", "export: ", r.checkpoint,
              " is not in a run folder's checkpoints/; give the output folder with --out DIR");
    r.out_dir = (checkpoints.parent_path() / "hf").string();
  }
  const TrainConfig config = checkpoint_config(r.checkpoint);
  models::GPT model(config.model);
  const io::CheckpointMeta meta = io::load_checkpoint(r.checkpoint, model.named_parameters(), nullptr, "");
  r.step = meta.step;
  r.arch = write_hf_folder(r.out_dir, config.model, model.named_parameters());
  return r;
}

}  // namespace cpf::trainer
