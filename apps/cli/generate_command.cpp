// `cpformer generate`: its command spec (command_table.h) and option checks; the sampling itself is
// generate.h. Every argument is checked before the checkpoint is opened for sampling, so a bad one is
// a usage error (exit 2) like every other command's, not a runtime error.
#include <cmath>

#include "apps/cli/cli.h"
#include "apps/cli/command_table.h"
#include "apps/config/config.h"
#include "apps/generate/generate.h"
#include "apps/run/checkpointing.h"

namespace cpf::trainer {
namespace {

GenerateOptions generate_options(const CommandLine& line) {
  GenerateOptions o;
  o.checkpoint = line.positional[0];
  o.prompt = line.value("--prompt");
  if (const auto tokens = line.value("--tokens")) {
    o.max_new_tokens = parse_integer_option("--tokens", *tokens);
    if (o.max_new_tokens < 1) throw UsageError("--tokens " + *tokens + ": expected at least 1 token to generate");
  }
  if (const auto temperature = line.value("--temperature")) {
    o.temperature = parse_real_option("--temperature", *temperature);
    if (!std::isfinite(o.temperature) || o.temperature < 0) {
      throw UsageError("--temperature " + *temperature + ": expected a finite number >= 0 (0 = greedy)");
    }
  }
  if (const auto seed = line.value("--seed")) {
    if (seed->find('-') != std::string::npos) throw UsageError("--seed " + *seed + ": expected a number >= 0");
    o.seed = parse_unsigned_option("--seed", *seed);
  }
  if (o.prompt && o.prompt->empty()) throw UsageError("--prompt: the prompt is empty; give the text to continue");
  o.prompts_file = line.value("--prompts");
  if (const auto top_k = line.value("--top-k")) o.top_k = parse_integer_option("--top-k", *top_k);
  if (const auto top_p = line.value("--top-p")) o.top_p = parse_real_option("--top-p", *top_p);
  if (const auto device = line.value("--device")) o.device = *device;
  o.precision = line.value("--precision");
  o.kv_cache = !line.has("--no-kv-cache");
  o.cuda_graph = !line.has("--no-cuda-graph");
  try {
    check_generate_options(o);  // sampling filters, --prompt/--prompts, device and precision names
  } catch (const Error& e) {
    throw UsageError(e.message());
  }
  // Only synthetic models have a default prompt (their first held-out example).
  if (!o.prompt && !o.prompts_file && checkpoint_config(resolve_checkpoint(o.checkpoint)).data.source != "synthetic") {
    throw UsageError("generate: a text model needs a prompt (--prompt TEXT)");
  }
  return o;
}

int run_generate(const CommandLine& line, std::ostream& out, std::ostream& err, bool) {
  if (line.positional.size() != 1) {
    throw UsageError("'generate' takes exactly one checkpoint folder, got " + std::to_string(line.positional.size()),
                     line.command);
  }
  const GenerateBatchResult batch = generate_batch(generate_options(line));
  for (const GenerateResult& r : batch.results) out << r.prompt_text << r.completion_text << std::endl;
  err << throughput_line(batch) << std::endl;  // stdout stays the completions alone
  return kExitOk;
}

}  // namespace

CommandSpec generate_command() {
  return {
      .name = "generate",
      .arguments = "CHECKPOINT_DIR",
      .summary = "sample from a checkpoint (or a run folder); greedy by default",
      .description =
          "CHECKPOINT_DIR is a checkpoint, a folder of checkpoints (the newest is used) or a run\n"
          "folder. Synthetic models continue their first held-out prompt when --prompt is not given.",
      .options = {{"--prompt", "TEXT", "the text to continue (required for text models)"},
                  {"--tokens", "N", "tokens to generate, at least 1 (default 64)"},
                  {"--temperature", "T", "sampling temperature >= 0; 0 = greedy (default 0)"},
                  {"--seed", "S", "seed of the sampling stream (default 1; prompt i of a file uses S + i)"},
                  {"--prompts", "FILE", "one prompt per line (empty lines skipped), decoded as one batch"},
                  {"--top-k", "K", "sample among the K most likely tokens; 0 = all (default 0)"},
                  {"--top-p", "P", "sample among the most likely tokens holding probability P, in (0, 1] (default 1)"},
                  {"--device", "D", "cpu, cuda or cuda:N (default cpu)"},
                  {"--precision", "P", "fp32 or bf16 (default bf16 on CUDA, fp32 on the CPU)"},
                  {"--no-kv-cache", "", "recompute the whole window for every token (same tokens, slower)"},
                  {"--no-cuda-graph", "", "launch every decoding step's kernels instead of replaying one graph"}},
      .run = run_generate};
}

}  // namespace cpf::trainer
