#include "apps/trainer/cli.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <new>

#include "apps/trainer/checkpointing.h"
#include "apps/trainer/config.h"
#include "apps/trainer/config_check.h"
#include "apps/trainer/generate.h"
#include "apps/trainer/stop_signals.h"
#include "apps/trainer/trainer.h"
#include "framework/distributed/launcher.h"

namespace cpf::trainer {
namespace {

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Args {
  std::string command;
  std::vector<std::string> positional;
  std::vector<std::string> overrides;
  std::optional<std::string> prompt;
  std::optional<std::string> tokens, temperature, seed;
  std::optional<std::string> gpus;  // train / check-config: --gpus N
};

Args parse(const std::vector<std::string>& args) {
  Args a;
  if (args.empty()) throw UsageError("no command given");
  a.command = args[0];
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& arg = args[i];
    auto value = [&](const char* flag) {
      if (i + 1 >= args.size()) throw UsageError(std::string(flag) + " needs a value");
      return args[++i];
    };
    if (arg == "--set") {
      a.overrides.push_back(value("--set"));
    } else if (arg.rfind("--set=", 0) == 0) {
      a.overrides.push_back(arg.substr(6));
    } else if (arg == "--prompt") {
      a.prompt = value("--prompt");
    } else if (arg == "--tokens") {
      a.tokens = value("--tokens");
    } else if (arg == "--temperature") {
      a.temperature = value("--temperature");
    } else if (arg == "--seed") {
      a.seed = value("--seed");
    } else if (arg == "--gpus") {
      a.gpus = value("--gpus");
    } else if (arg.rfind("--gpus=", 0) == 0) {
      a.gpus = arg.substr(7);
    } else if (arg.size() > 1 && arg[0] == '-') {
      throw UsageError("unknown option '" + arg + "'");
    } else {
      a.positional.push_back(arg);
    }
  }
  return a;
}

void expect_positional(const Args& a, const char* what) {
  if (a.positional.size() != 1) {
    throw UsageError("'" + a.command + "' takes exactly one " + what + ", got " + std::to_string(a.positional.size()));
  }
}

void only_flags(const Args& a, bool overrides, bool generate) {
  if (!overrides && !a.overrides.empty()) throw UsageError("'" + a.command + "' takes no --set");
  if (!overrides && a.gpus) throw UsageError("'" + a.command + "' takes no --gpus");
  if (!generate && (a.prompt || a.tokens || a.temperature || a.seed)) {
    throw UsageError("--prompt, --tokens, --temperature and --seed apply to 'generate' only");
  }
}

template <class T>
T number(const std::string& flag, const std::string& text) {
  size_t used = 0;
  try {
    T v;
    if constexpr (std::is_same_v<T, double>) {
      v = std::stod(text, &used);
    } else {
      v = static_cast<T>(std::stoll(text, &used));
    }
    if (used == text.size()) return v;
  } catch (const std::exception&) {
  }
  throw UsageError(flag + " " + text + ": expected a number");
}

// The config with --set applied and, with --gpus N, the N-GPU form of it: run.device=cuda,
// parallel.backend=nccl and parallel.dp = N / parallel.cp (the config's cp is kept).
TrainConfig load_config(const Args& a) {
  std::vector<std::string> overrides = a.overrides;
  if (!a.gpus) return load_train_config(a.positional[0], overrides);
  const auto n = number<int64_t>("--gpus", *a.gpus);
  if (n < 1) throw UsageError("--gpus " + *a.gpus + ": expected at least 1 GPU");
  overrides.push_back("run.device=cuda");
  overrides.push_back("parallel.backend=nccl");
  const TrainConfig c = load_train_config(a.positional[0], overrides);
  if (c.parallel.dp * c.parallel.cp == n) return c;
  const bool dp_given = std::any_of(a.overrides.begin(), a.overrides.end(),
                                    [](const std::string& o) { return o.rfind("parallel.dp=", 0) == 0; });
  if (dp_given) {
    throw UsageError("--gpus " + std::to_string(n) + " and --set parallel.dp=" + std::to_string(c.parallel.dp) +
                     " disagree: ranks = parallel.dp x parallel.cp = " + std::to_string(c.parallel.dp) + " x " +
                     std::to_string(c.parallel.cp) + "; drop one of them");
  }
  if (n % c.parallel.cp != 0) {
    throw UsageError("--gpus " + std::to_string(n) + " is not a multiple of parallel.cp=" +
                     std::to_string(c.parallel.cp) + " (ranks = parallel.dp x parallel.cp); pick a multiple or set "
                     "--set parallel.cp=...");
  }
  overrides.push_back("parallel.dp=" + std::to_string(n / c.parallel.cp));
  return load_train_config(a.positional[0], overrides);
}

std::string percent(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100 * v);
  return buf;
}

std::string fixed(double v, const char* format = "%.4f") {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

int check_config(const Args& a, std::ostream& out) {
  expect_positional(a, "config file");
  only_flags(a, true, false);
  print_config_check(a.positional[0], load_config(a), out);
  return kExitOk;
}

int train_command(const Args& a, std::ostream& out, bool terminal) {
  expect_positional(a, "config file");
  only_flags(a, true, false);
  const TrainConfig c = load_config(a);
  const TrainOutcome r = train(c, out, terminal);
  if (r.stop_signal != 0) {  // stopped by SIGINT / SIGTERM (stop_signals.h): how to continue, and 128 + signal
    if (r.reporter) {
      out << "resume with: " << resume_command(a.positional[0], a.overrides, a.gpus, c.run.resume) << std::endl;
    }
    return stop_signal_exit_code(r.stop_signal);
  }
  if (!r.reporter) return kExitOk;  // a rank > 0 process under a launcher: rank 0 reports
  std::string line = "done: step " + std::to_string(r.final_step) + "/" + std::to_string(c.run.steps) + " in " +
                     format_duration(r.seconds);
  if (!r.losses.empty()) line += " | train loss " + fixed(r.losses.back());
  if (r.last_eval && r.last_eval->loss) line += " | eval loss " + fixed(*r.last_eval->loss);
  if (r.last_eval && r.last_eval->accuracy) {
    line += " | exact match " + percent(*r.last_eval->accuracy) + " (" + std::to_string(r.last_eval->num_correct) +
            "/" + std::to_string(r.last_eval->num_examples) + ")";
  }
  std::string target;
  if (c.run.target_accuracy > 0) target = "exact match >= " + percent(c.run.target_accuracy);
  if (c.run.target_loss > 0) {
    target += (target.empty() ? "" : " or ") + std::string("eval loss <= ") + fixed(c.run.target_loss);
  }
  if (r.target_set) {
    line += " | target " + target +
            (r.target_reached ? " reached at step " + std::to_string(r.target_step) : std::string(" NOT reached"));
  }
  line += " | " + r.run_dir;
  out << line << std::endl;
  return r.target_set && !r.target_reached ? kExitTargetMissed : kExitOk;
}

// Every generate argument is checked before any sampling, so a bad one is a usage error (exit 2) like
// every other command's, not a runtime error.
GenerateOptions generate_options(const Args& a) {
  GenerateOptions o;
  o.checkpoint = a.positional[0];
  o.prompt = a.prompt;
  if (a.tokens) {
    o.max_new_tokens = number<int64_t>("--tokens", *a.tokens);
    if (o.max_new_tokens < 1) throw UsageError("--tokens " + *a.tokens + ": expected at least 1 token to generate");
  }
  if (a.temperature) {
    o.temperature = number<double>("--temperature", *a.temperature);
    if (!std::isfinite(o.temperature) || o.temperature < 0) {
      throw UsageError("--temperature " + *a.temperature + ": expected a finite number >= 0 (0 = greedy)");
    }
  }
  if (a.seed) {
    if (a.seed->find('-') != std::string::npos) throw UsageError("--seed " + *a.seed + ": expected a number >= 0");
    o.seed = number<uint64_t>("--seed", *a.seed);
  }
  if (o.prompt && o.prompt->empty()) throw UsageError("--prompt: the prompt is empty; give the text to continue");
  // Only synthetic models have a default prompt (their first held-out example).
  if (!o.prompt && checkpoint_config(resolve_checkpoint(o.checkpoint)).data.source == "text") {
    throw UsageError("generate: a text model needs a prompt (--prompt TEXT)");
  }
  return o;
}

int generate_command(const Args& a, std::ostream& out) {
  expect_positional(a, "checkpoint folder");
  only_flags(a, false, true);
  const GenerateResult r = generate(generate_options(a));
  out << r.prompt_text << r.completion_text << std::endl;
  return kExitOk;
}

}  // namespace

std::string usage() {
  return "usage: cpformer <command> [arguments]\n"
         "  train CONFIG [--set key.path=value]... [--gpus N]\n"
         "                                             train a GPT from a YAML config (configs/default.yaml);\n"
         "                                             --gpus N: on N GPUs of this machine (NCCL, dp = N / cp)\n"
         "  generate CHECKPOINT_DIR [--prompt TEXT] [--tokens N] [--temperature T] [--seed S]\n"
         "                                             sample from a checkpoint (or run folder); greedy by default\n"
         "  check-config CONFIG [--set key.path=value]... [--gpus N]\n"
         "                                             validate a config (CP support included) without training;\n"
         "                                             OK only when its data files and devices were checked too\n"
         "  docs                                       print the table of every config key (docs/config.md)\n"
         "exit codes: 0 ok, 1 error, 2 config or usage error, 3 unreadable data, 4 training target not reached,\n"
         "            130 / 143 stopped by SIGINT / SIGTERM (after a checkpoint; run the same command to resume)\n";
}

int run_cli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err, bool terminal) {
  try {
    if (!args.empty() && (args[0] == "--help" || args[0] == "-h" || args[0] == "help")) {
      out << usage();
      return kExitOk;
    }
    const Args a = parse(args);
    if (a.command == "train") return train_command(a, out, terminal);
    if (a.command == "generate") return generate_command(a, out);
    if (a.command == "check-config") return check_config(a, out);
    if (a.command == "docs") {
      only_flags(a, false, false);
      if (!a.positional.empty()) throw UsageError("'docs' takes no arguments");
      out << config_docs_markdown();
      return kExitOk;
    }
    throw UsageError("unknown command '" + a.command + "'");
  } catch (const UsageError& e) {
    err << "cpformer: " << e.what() << "\n" << usage();
    return kExitConfig;
  } catch (const config::ConfigError& e) {
    err << e.what() << std::endl;
    return kExitConfig;
  } catch (const DataError& e) {
    err << "cpformer: data error: " << e.what() << std::endl;
    return kExitData;
  } catch (const Error& e) {
    err << "cpformer: error: " << e.message() << std::endl;
    return kExitError;
  } catch (const std::bad_alloc&) {
    // Tensor storage names its size; anything else only says std::bad_alloc.
    err << "cpformer: error: out of host memory (std::bad_alloc) in '" << (args.empty() ? "cpformer" : args[0])
        << "' outside the tensor allocator; lower the model, batch or data sizes, or raise the memory limit"
        << std::endl;
    return kExitError;
  } catch (const std::exception& e) {
    err << "cpformer: error: " << e.what() << std::endl;
    return kExitError;
  }
}

}  // namespace cpf::trainer
