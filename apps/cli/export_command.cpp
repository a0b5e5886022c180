// `cpformer export RUN --format hf [--out DIR]`: a checkpoint's weights as a Hugging Face model folder
// (config.json + model.safetensors, apps/trainer/hf_folder.h) that transformers' from_pretrained loads.
#include <filesystem>
#include <iostream>

#include "apps/trainer/checkpointing.h"
#include "apps/trainer/cli.h"
#include "apps/trainer/command_table.h"
#include "apps/trainer/hf_export.h"
#include "apps/trainer/hf_folder.h"
#include "framework/io/checkpoint.h"

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

namespace {

int run_export(const CommandLine& line, std::ostream& out, std::ostream&, bool) {
  if (line.positional.size() != 1) {
    throw UsageError(
        "'export' takes exactly one run or checkpoint folder, got " + std::to_string(line.positional.size()),
        line.command);
  }
  const std::optional<std::string> format = line.value("--format");
  if (!format) throw UsageError("export: --format is required (hf: a Hugging Face model folder)", line.command);
  if (*format != "hf") throw UsageError("--format " + *format + ": expected hf", line.command);
  const HfExportResult r = export_hf(line.positional[0], line.value("--out"));
  out << "exported " << r.checkpoint << " (step " << r.step << ") as " << models::hf_architecture_name(r.arch) << " to "
      << r.out_dir << ": " << kHfConfigFile << ", " << kHfWeightsFile << std::endl;
  return kExitOk;
}

}  // namespace

CommandSpec export_command() {
  return {.name = "export",
          .arguments = "RUN",
          .summary = "write a checkpoint as a Hugging Face model folder (GPT-2 or Llama shape)",
          .description =
              "RUN is a run folder, a folder of checkpoints (the newest is used) or a checkpoint. The\n"
              "folder holds config.json and model.safetensors with Hugging Face names (GPT2LMHeadModel\n"
              "or LlamaForCausalLM), which transformers' from_pretrained loads; docs/checkpoints.md.",
          .options = {{"--format", "F", "the output format: hf (required)"},
                      {"--out", "DIR", "the output folder, new or empty (default: RUN's hf/)"}},
          .run = run_export};
}

}  // namespace cpf::trainer
