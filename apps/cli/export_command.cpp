// `cpformer export RUN --format hf [--out DIR]`: a checkpoint's weights as a Hugging Face model folder
// (config.json + model.safetensors, apps/run/hf_folder.h) that transformers' from_pretrained loads.
#include <filesystem>
#include <iostream>

#include "apps/cli/cli.h"
#include "apps/cli/command_table.h"
#include "apps/export/hf_export.h"
#include "apps/run/hf_folder.h"

namespace cpf::trainer {
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
