// `cpformer train`, `cpformer check-config` and `cpformer docs`: their command specs (command_table.h)
// and what they do.
#include <algorithm>

#include "apps/cli/cli.h"
#include "apps/cli/command_table.h"
#include "apps/cli/config_check.h"
#include "apps/cli/train_summary.h"
#include "apps/config/config.h"
#include "apps/trainer/memory_plan.h"
#include "apps/trainer/stop_signals.h"
#include "apps/trainer/trainer.h"

namespace cpf::trainer {
namespace {

const OptionSpec kSetOption{"--set", "key.path=value",
                            "override a config key (repeatable; the key list: cpformer docs, docs/config.md)", true};
const OptionSpec kProfileOption{"--profile", "N",
                                "profile N steps after the first: a per-op GPU time table (as --set run.profile=N)"};
const OptionSpec kMemoryOption{"--memory", "",
                               "print the memory plan: per-rank bytes of each part and the longest context that fits"};
const OptionSpec kDeviceMemoryOption{
    "--device-memory", "DEVICE", "the device the plan is for: h100, h200 or a size (80GiB, 141GB); implies --memory"};
const OptionSpec kGpusOption{"--gpus", "N", "train on N GPUs of this machine (NCCL; parallel.dp = N / parallel.cp)"};

void expect_one_positional(const CommandLine& line, const char* what) {
  if (line.positional.size() != 1) {
    throw UsageError(
        "'" + line.command + "' takes exactly one " + what + ", got " + std::to_string(line.positional.size()),
        line.command);
  }
}

// The config with --set applied and, with --gpus N, the N-GPU form of it: run.device=cuda,
// parallel.backend=nccl and parallel.dp = N / parallel.cp (the config's cp is kept).
TrainConfig load_config(const CommandLine& line) {
  const std::vector<std::string> given = line.values("--set");
  std::vector<std::string> overrides = given;
  if (const auto profile = line.value("--profile")) {
    const int64_t n = parse_integer_option("--profile", *profile);
    if (n < 1) throw UsageError("--profile " + *profile + ": expected a number of steps, at least 1");
    overrides.push_back("run.profile=" + std::to_string(n));
  }
  const auto gpus = line.value("--gpus");
  if (!gpus) return load_train_config(line.positional[0], overrides);
  const int64_t n = parse_integer_option("--gpus", *gpus);
  if (n < 1) throw UsageError("--gpus " + *gpus + ": expected at least 1 GPU");
  overrides.push_back("run.device=cuda");
  overrides.push_back("parallel.backend=nccl");
  const TrainConfig c = load_train_config(line.positional[0], overrides);
  if (c.parallel.dp * c.parallel.cp == n) return c;
  const bool dp_given =
      std::any_of(given.begin(), given.end(), [](const std::string& o) { return o.rfind("parallel.dp=", 0) == 0; });
  if (dp_given) {
    throw UsageError("--gpus " + std::to_string(n) + " and --set parallel.dp=" + std::to_string(c.parallel.dp) +
                     " disagree: ranks = parallel.dp x parallel.cp = " + std::to_string(c.parallel.dp) + " x " +
                     std::to_string(c.parallel.cp) + "; drop one of them");
  }
  if (n % c.parallel.cp != 0) {
    throw UsageError("--gpus " + std::to_string(n) +
                     " is not a multiple of parallel.cp=" + std::to_string(c.parallel.cp) +
                     " (ranks = parallel.dp x parallel.cp); pick a multiple or set "
                     "--set parallel.cp=...");
  }
  overrides.push_back("parallel.dp=" + std::to_string(n / c.parallel.cp));
  return load_train_config(line.positional[0], overrides);
}

int run_check_config(const CommandLine& line, std::ostream& out, std::ostream&, bool) {
  expect_one_positional(line, "config file");
  const TrainConfig config = load_config(line);
  print_config_check(line.positional[0], config, out);
  if (line.has("--memory") || line.has("--device-memory")) {
    print_memory_plan(config, line.value("--device-memory").value_or(""), out);
  }
  return kExitOk;
}

int run_train(const CommandLine& line, std::ostream& out, std::ostream&, bool terminal) {
  expect_one_positional(line, "config file");
  const TrainConfig c = load_config(line);
  const TrainOutcome r = train(c, out, terminal);
  if (r.stop_signal != 0) {  // stopped by SIGINT / SIGTERM (stop_signals.h): how to continue, and 128 + signal
    if (r.reporter) {
      const std::string resume = "resume with: " + resume_command(line.positional[0], line.values("--set"),
                                                                  line.value("--gpus"), c.run.resume);
      out << resume << std::endl;
      append_to_train_log(r, resume);
    }
    return stop_signal_exit_code(r.stop_signal);
  }
  if (!r.reporter) return kExitOk;  // a rank > 0 process under a launcher: rank 0 reports
  const std::string summary = summary_line(c, r);
  out << summary << std::endl;
  append_to_train_log(r, summary);
  return r.target_set && !r.target_reached ? kExitTargetMissed : kExitOk;
}

int run_docs(const CommandLine& line, std::ostream& out, std::ostream&, bool) {
  if (!line.positional.empty()) throw UsageError("'docs' takes no arguments", line.command);
  out << config_docs_markdown();
  return kExitOk;
}

}  // namespace

CommandSpec train_command() {
  return {.name = "train",
          .arguments = "CONFIG",
          .summary = "train a GPT from a YAML config (configs/default.yaml)",
          .description =
              "Trains on the CPU (thread ranks) or on GPUs as the config says, writing the run folder\n"
              "run.out_dir/run.name: config.yaml, metrics.jsonl, train.log (the console with timestamps),\n"
              "checkpoints/ and loss.svg. Running the same command again resumes from the newest checkpoint\n"
              "(run.resume: auto). When stdout is not a terminal a heartbeat line appears at least every 30 s\n"
              "of a long step or evaluation. Ctrl-C / SIGTERM stop after the current step with a checkpoint.\n"
              "docs/training.md explains every line it prints.",
          .options = {kSetOption, kGpusOption, kProfileOption},
          .run = run_train};
}

CommandSpec check_config_command() {
  return {.name = "check-config",
          .arguments = "CONFIG",
          .summary = "validate a config (CP support, data files, devices) without training",
          .description =
              "Prints the resolved model and parallel layout and what was checked; says OK only when the\n"
              "data files and devices were checked too (otherwise 'NOT fully checked' and why). --memory adds\n"
              "the memory plan (docs/long_context.md).",
          .options = {kSetOption, kGpusOption, kMemoryOption, kDeviceMemoryOption},
          .run = run_check_config};
}

CommandSpec docs_command() {
  return {.name = "docs",
          .arguments = "",
          .summary = "print the table of every config key (docs/config.md)",
          .description = "Markdown: key, type, default, allowed range or values, meaning.",
          .options = {},
          .run = run_docs};
}

}  // namespace cpf::trainer
