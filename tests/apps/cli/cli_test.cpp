// The cpformer command line: config errors (exit 2, one "file:line:column: key=value problem" line),
// usage errors, check-config on every shipped config, and docs/config.md staying in sync.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "apps/cli/fatal_handler.h"
#include "apps/config/config.h"
#include "framework/distributed/launcher.h"
#include "framework/tensor/storage.h"
#include "support/sanitizers.h"
#include "support/test_utils.h"
#include "tests/apps/cli_support.h"

namespace cpf::trainer {
namespace {

using testing::read_file;
using testing::repo_root;
using testing::run;
using testing::scratch_dir;
using testing::write_file;

// Writes `yaml` as x.yaml in a scratch folder and runs check-config on it.
struct ConfigCase {
  std::filesystem::path dir;
  std::string path;
  explicit ConfigCase(const std::string& yaml) {
    dir = scratch_dir("config");
    path = (dir / "x.yaml").string();
    write_file(path, yaml);
  }
};

void expect_config_error(const std::string& yaml, const std::string& expected,
                         const std::vector<std::string>& extra = {}) {
  ConfigCase c(yaml);
  std::vector<std::string> args{"check-config", c.path};
  args.insert(args.end(), extra.begin(), extra.end());
  const auto r = run(args);
  EXPECT_EQ(r.code, kExitConfig) << r.out << r.err;
  EXPECT_NE(r.err.find(expected), std::string::npos) << "stderr: " << r.err << "\nexpected: " << expected;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one message line: " << r.err;
  // train reads the config the same way and stops before doing anything.
  args[0] = "train";
  const auto t = run(args);
  EXPECT_EQ(t.code, kExitConfig);
  EXPECT_EQ(t.err, r.err);
}

TEST(CliConfig, UnknownKeyNamesTheValidOnes) {
  expect_config_error("model:\n  hiden_size: 32\n", "x.yaml:2:3: unknown key 'model.hiden_size' (valid keys here: ");
}

TEST(CliConfig, WrongTypeNamesTheKeyAndValue) {
  expect_config_error("run:\n  steps: many\n", "x.yaml:2:10: run.steps=many: expected an integer");
  expect_config_error("model:\n  tie_embeddings: maybe\n",
                      "x.yaml:2:19: model.tie_embeddings=maybe: expected true or false");
  expect_config_error("parallel:\n  cp_comm_type: ring\n",
                      "x.yaml:2:17: parallel.cp_comm_type=ring is not one of: p2p, all_gather, a2a, a2a+p2p");
  expect_config_error("data:\n  source: csv\n", "x.yaml:2:11: data.source=csv is not one of: synthetic, text, shards");
}

TEST(CliConfig, DivisibilityIsReportedAtTheOffendingKey) {
  expect_config_error("model:\n  hidden_size: 32\n  num_heads: 8\n  attention: gqa\n  num_kv_heads: 3\n",
                      "x.yaml:5:17: model.num_kv_heads=3 must divide num_heads=8");
  expect_config_error("model:\n  hidden_size: 30\n  num_heads: 4\n",
                      "x.yaml:3:14: model.num_heads=4 must divide hidden_size=30 (or set head_dim)");
}

TEST(CliConfig, UnsupportedContextParallelCombination) {
  expect_config_error(
      "model:\n  hidden_size: 48\n  num_heads: 6\ndata:\n  pad_multiple: 8\nparallel:\n  cp: 4\n  cp_comm_type: a2a\n",
      "x.yaml:8:17: parallel.cp_comm_type=a2a is not supported here: a2a: num_heads=6 is not divisible by the cp "
      "size=4");
  expect_config_error("data:\n  pad_multiple: 8\nparallel:\n  cp: 4\n  cp_comm_type: a2a+p2p\n  cp_a2a_size: 4\n",
                      "x.yaml:5:17: parallel.cp_comm_type=a2a+p2p is not supported here: a2a+p2p: cp size 4 must split "
                      "into a2a size 4 x p2p size, both at least 2");
  // attention.cp_mla_latent: on with an MLA model needs a strategy that moves K/V blocks.
  expect_config_error(
      "model:\n  attention: mla\ndata:\n  pad_multiple: 4\nparallel:\n  cp: 2\n  cp_comm_type: a2a\nattention:\n  "
      "cp_mla_latent: on\n",
      "x.yaml:7:17: parallel.cp_comm_type=a2a is not supported here: a2a: MLA latent communication runs under p2p, "
      "all_gather and a2a+p2p (Ulysses alone moves heads, not K/V blocks); set attention.cp_mla_latent: off or auto");
  // The padding CP needs, when the key is not in the file: the file is named without a position.
  expect_config_error("parallel:\n  cp: 2\n",
                      "x.yaml: data.pad_multiple=1 must be a multiple of 2 x parallel.cp = 4 (context parallelism cuts "
                      "every sequence slot into 2 x cp chunks)");
  expect_config_error("data:\n  layout: bshd\n  seq_len: 18\nparallel:\n  cp: 2\n",
                      "x.yaml:3:12: data.seq_len=18 must be a multiple of 2 x parallel.cp = 4");
  // Head groups of the pipelined all-to-all must divide the heads each rank attends (4 heads over 2 ranks).
  expect_config_error(
      "data:\n  pad_multiple: 4\nparallel:\n  cp: 2\n  cp_comm_type: a2a\n  cp_a2a_head_groups: 3\n",
      "x.yaml:6:23: parallel.cp_a2a_head_groups=3 does not divide the 2 query heads and 2 KV heads each "
      "rank attends after the all-to-all; use 0 (automatic) or a common divisor of 2 and 2");
}

TEST(CliConfig, CrossSectionChecks) {
  expect_config_error("model:\n  vocab_size: 10\n",
                      "x.yaml:2:15: model.vocab_size=10 is smaller than the vocabulary of the data (14 tokens)");
  expect_config_error(
      "data:\n  min_len: 3\n  max_len: 2\n",
      "x.yaml:2:12: data.min_len=3: synthetic task addition needs 1 <= min_len <= max_len, got min_len=3 "
      "max_len=2");
  expect_config_error("model:\n  positions: learned\n  max_positions: 8\ndata:\n  seq_len: 16\n",
                      "x.yaml:3:18: model.max_positions=8 must be at least data.seq_len=16 with learned positions");
  expect_config_error("run:\n  steps: 10\nschedule:\n  warmup_steps: 20\n",
                      "x.yaml:4:17: schedule.warmup_steps=20 must not exceed the decay length of 10 steps");
  expect_config_error("optimizer:\n  type: sgd\n  momentum: 0\n  nesterov: true\n",
                      "x.yaml:4:13: optimizer.nesterov=true needs optimizer.momentum > 0");
  expect_config_error("run:\n  target_accuracy: 0.9\ndata:\n  source: text\n  path: x.txt\n",
                      "x.yaml:2:20: run.target_accuracy=0.9 needs data.source: synthetic");
  expect_config_error("run:\n  eval_path: held_out.txt\n",
                      "x.yaml:2:14: run.eval_path=held_out.txt applies to text and shards");
}

TEST(CliConfig, OverridesAreCheckedAndLocatedAsSuch) {
  expect_config_error("run:\n  steps: 5\n", "--set model.num_layers=0: model.num_layers=0 is out of range [1, 1024]",
                      {"--set", "model.num_layers=0"});
  expect_config_error("run:\n  steps: 5\n", "--set model.nope=1", {"--set", "model.nope=1"});
  expect_config_error("run:\n  steps: 5\n",
                      "--set data.pad_multiple=2: data.pad_multiple=2 must be a multiple of 2 x parallel.cp = 4",
                      {"--set=parallel.cp=2", "--set", "data.pad_multiple=2"});
  // A cross-field conflict a --set introduced with a key of the file (or a default) names the --set.
  expect_config_error("data:\n  pad_multiple: 2\n",
                      "--set parallel.cp=2: data.pad_multiple=2 must be a multiple of 2 x parallel.cp = 4",
                      {"--set", "parallel.cp=2"});
  expect_config_error("schedule:\n  warmup_steps: 20\n",
                      "--set run.steps=10: schedule.warmup_steps=20 must not exceed the decay length of 10 steps",
                      {"--set", "run.steps=10"});
  expect_config_error("run:\n  steps: 5\n", "--set parallel.cp=2: data.pad_multiple=1 must be a multiple of 2",
                      {"--set", "parallel.cp=2"});
  // Both in the file: the file's key is named.
  expect_config_error("run:\n  steps: 10\nschedule:\n  warmup_steps: 20\n",
                      "x.yaml:4:17: schedule.warmup_steps=20 must not exceed the decay length of 10 steps");
}

TEST(CliConfig, UnreadableOrInvalidYaml) {
  const auto missing = run({"check-config", "/nonexistent/x.yaml"});
  EXPECT_EQ(missing.code, kExitConfig);
  EXPECT_NE(missing.err.find("/nonexistent/x.yaml: cannot open the config file"), std::string::npos) << missing.err;
  expect_config_error("model: [1, 2\n", "x.yaml:");
  expect_config_error("- a\n- b\n", "x.yaml:1:1: the config must be a mapping of sections");
}

TEST(CliStrictConfig, TextYamlWouldMisreadIsRefusedByTrainAndCheckConfig) {
  expect_config_error("run:\n  steps: 5\n  steps: 7\n", "x.yaml:3:3: duplicate key 'run.steps' (first at line 2)");
  expect_config_error("run:\n  steps: 5\n---\nrun:\n  steps: 7\n", "x.yaml:3: a second YAML document starts here");
  expect_config_error("run:\n  name: \"abc\n",
                      "x.yaml:2:9: the quote \" opened here is never closed (YAML would read to the end of the file: "
                      "\"abc \"); close it on this line");
  expect_config_error("run:\n  steps: 010\n",
                      "x.yaml:2:10: run.steps=010: a leading zero makes YAML read an integer as octal (010 is 8); "
                      "write 10 without the zero");
  expect_config_error("run:\n  name: a\bc\n", "x.yaml:2:10: control character 0x08 in the file");
  expect_config_error("", "x.yaml:1: the config is empty (no keys), so every default would train without a word");
  expect_config_error("# nothing but a comment\n", "x.yaml:1: the config is empty (no keys)");
}

TEST(CliStrictConfig, NamesAndPathsWithControlCharactersOrEdgeSpaces) {
  expect_config_error("run:\n  name: \"a\\b\"\n",
                      "x.yaml:2:9: run.name=\"a\\x08\" holds a control character; names and paths may not");
  expect_config_error("run:\n  name: \"abc\\0\"\n",
                      "x.yaml:2:9: run.name=\"abc\\x00\" holds a control character; names and paths may not");
  expect_config_error("run:\n  name: \"abc \"\n",
                      "x.yaml:2:9: run.name=\"abc \" begins or ends with a space; remove it (it would become part of "
                      "a folder name)");
  expect_config_error("data:\n  source: text\n  path: \"docs/\\t*.md\"\n",
                      "x.yaml:3:9: data.path=\"docs/\\x09*.md\" holds a control character");
  expect_config_error("run:\n  steps: 5\n",
                      "--set run.out_dir=\"x\\ny\": run.out_dir=\"x\\x0ay\" holds a control character",
                      {"--set", "run.out_dir=\"x\\ny\""});
}

TEST(CliStrictConfig, TargetsThatCanNeverBeReached) {
  expect_config_error(
      "run:\n  target_accuracy: 0.9\n  eval_examples: 0\n",
      "x.yaml:2:20: run.target_accuracy=0.9 can never be reached: run.eval_examples=0 measures no exact "
      "match; set run.eval_examples > 0 or run.target_accuracy: 0");
  expect_config_error("run:\n  target_loss: 1.5\n  eval_batches: 0\n",
                      "x.yaml:2:16: run.target_loss=1.5 can never be reached: run.eval_batches=0 measures no held-out "
                      "loss; set run.eval_batches > 0 or run.target_loss: 0");
  expect_config_error("run:\n  target_loss: 1.5\ndata:\n  source: text\n  path: x.txt\n",
                      "x.yaml:2:16: run.target_loss=1.5 can never be reached: data.source=text has no held-out loss "
                      "without run.eval_path; set run.eval_path or run.target_loss: 0");
  // The --set that makes a target unreachable is the one blamed.
  expect_config_error("run:\n  target_accuracy: 0.9\n",
                      "--set run.eval_examples=0: run.target_accuracy=0.9 can never be reached: run.eval_examples=0 "
                      "measures no exact match; set run.eval_examples > 0 or run.target_accuracy: 0",
                      {"--set", "run.eval_examples=0"});
}

TEST(CliStrictConfig, DirectoriesAndSetMistakes) {
  const auto dir = scratch_dir("dir");
  const auto r = run({"check-config", dir.string()});
  EXPECT_EQ(r.code, kExitConfig);
  EXPECT_EQ(r.err, dir.string() + ": is a directory, not a config file; name the YAML file in it\n");
  EXPECT_EQ(run({"train", dir.string()}).code, kExitConfig);
  expect_config_error("run:\n  steps: 5\n",
                      "--set runn.steps=5: unknown key 'runn' (valid keys here: ", {"--set", "runn.steps=5"});
  expect_config_error("run:\n  steps: 5\n", "--set run=7: 'run' is a section; set its keys one by one",
                      {"--set", "run=7"});
  expect_config_error("run:\n  steps: 5\n", "--set run.steps=08: run.steps=08: a leading zero makes YAML read",
                      {"--set", "run.steps=08"});
}

// In a death-test child: 100 rank threads in an address space capped at what is mapped now plus
// 256 MiB (8 MiB stacks each: they cannot all start). Exits with cpformer's code, its stderr printed.
[[noreturn]] void train_100_ranks_with_capped_memory(const std::string& out_dir) {
  std::ifstream statm("/proc/self/statm");
  size_t pages = 0;
  statm >> pages;
  rlim_t cap = pages * 4096 + (rlim_t{256} << 20);
  rlimit current{};
  getrlimit(RLIMIT_AS, &current);
  if (current.rlim_max != RLIM_INFINITY && current.rlim_max < cap) cap = current.rlim_max;  // only lowered
  const rlimit limit{cap, cap};
  if (setrlimit(RLIMIT_AS, &limit) != 0) std::exit(5);
  const auto r = run({"train", (repo_root() / "configs" / "tiny.yaml").string(), "--set", "parallel.dp=100", "--set",
                      "run.steps=2", "--set", "run.out_dir=" + out_dir});
  std::fputs(r.err.c_str(), stderr);
  std::exit(r.code);
}

TEST(CliResources, RanksThatCannotStartEndWithANamedErrorNotTerminate) {
  if (::cpf::testing::kSanitized) GTEST_SKIP() << "address-space limits are incompatible with the sanitizer runtime";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // Was "terminate called without an active exception" (exit 134). Which resource runs out first
  // (a rank thread, a rank's progress thread, or memory) depends on the machine; each is named.
  EXPECT_EXIT(train_100_ranks_with_capped_memory(scratch_dir("run").string()), ::testing::ExitedWithCode(kExitError),
              "cpformer: error: launch: rank [0-9]+ failed: (could not start the thread of rank [0-9]+ of 100|thread "
              "backend: could not start the progress thread of rank [0-9]+|out of host memory)");
}

TEST(CliResources, AnExceptionNoCodeCanCatchIsNamedBeforeTheAbort) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto escape_from_thread = [](auto make_exception) {
    install_fatal_handler();
    std::thread([&] { throw make_exception(); }).join();
  };
  EXPECT_EXIT(escape_from_thread([] { return std::bad_alloc(); }), ::testing::KilledBySignal(SIGABRT),
              "cpformer: fatal: out of host memory \\(std::bad_alloc\\) in a thread that cannot report it");
  EXPECT_EXIT(escape_from_thread([] { return std::runtime_error("disk on fire"); }), ::testing::KilledBySignal(SIGABRT),
              "cpformer: fatal: uncaught exception in a thread that cannot report it: disk on fire");
}

TEST(CliUsage, GenerateArgumentsAreUsageErrors) {
  auto expect_usage = [](const std::vector<std::string>& args, const std::string& message) {
    const auto r = run(args);
    EXPECT_EQ(r.code, kExitConfig) << r.err;
    EXPECT_EQ(r.err.rfind("cpformer: " + message + "\nusage: cpformer", 0), 0u) << r.err;
  };
  // Checked before the checkpoint is opened: the folder does not matter.
  expect_usage({"generate", "dir", "--tokens", "0"}, "--tokens 0: expected at least 1 token to generate");
  expect_usage({"generate", "dir", "--tokens", "-3"}, "--tokens -3: expected at least 1 token to generate");
  expect_usage({"generate", "dir", "--temperature", "-1"},
               "--temperature -1: expected a finite number >= 0 (0 = greedy)");
  expect_usage({"generate", "dir", "--temperature", "nan"},
               "--temperature nan: expected a finite number >= 0 (0 = greedy)");
  expect_usage({"generate", "dir", "--temperature", "inf"},
               "--temperature inf: expected a finite number >= 0 (0 = greedy)");
  expect_usage({"generate", "dir", "--seed", "-1"}, "--seed -1: expected a number >= 0");
  expect_usage({"generate", "dir", "--prompt", ""}, "--prompt: the prompt is empty; give the text to continue");
}

TEST(CliUsage, BadCommandLinesExitWithUsage) {
  auto expect_usage = [](const std::vector<std::string>& args, const std::string& message) {
    const auto r = run(args);
    EXPECT_EQ(r.code, kExitConfig);
    EXPECT_NE(r.err.find("cpformer: " + message), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("usage: cpformer"), std::string::npos);
  };
  expect_usage({}, "no command given");
  expect_usage({"fly"}, "unknown command 'fly'");
  expect_usage({"train"}, "'train' takes exactly one config file, got 0");
  expect_usage({"check-config", "a.yaml", "b.yaml"}, "'check-config' takes exactly one config file, got 2");
  expect_usage({"train", "a.yaml", "--bogus"}, "unknown option '--bogus'");
  expect_usage({"train", "a.yaml", "--set"}, "--set needs a value");
  expect_usage({"train", "a.yaml", "--prompt", "x"}, "'train' takes no --prompt (an option of 'generate')");
  expect_usage({"generate", "dir", "--tokens", "ten"}, "--tokens ten: expected a number");
  expect_usage({"generate", "dir", "--set", "a=b"}, "'generate' takes no --set");
  expect_usage({"docs", "extra"}, "'docs' takes no arguments");
  const auto help = run({"--help"});
  EXPECT_EQ(help.code, kExitOk);
  EXPECT_NE(help.out.find("check-config CONFIG"), std::string::npos);
}

TEST(CliCheckConfig, EveryShippedConfigPasses) {
  const auto root = repo_root();
  const auto cwd = std::filesystem::current_path();
  std::filesystem::current_path(root);  // data paths in configs/ are relative to the repository root
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(root / "configs")) {
    if (entry.path().extension() != ".yaml") continue;
    const std::string rel = "configs/" + entry.path().filename().string();
    const auto r = run({"check-config", rel});
    EXPECT_EQ(r.code, kExitOk) << rel << ": " << r.err;
    // OK, or (GPU configs on a machine without CUDA, shards before their download) what was not checked.
    const bool ok = r.out.rfind(rel + ": OK\n", 0) == 0;
    EXPECT_TRUE(ok || r.out.rfind(rel + ": config valid, NOT fully checked (", 0) == 0) << r.out;
    if (!ok) EXPECT_NE(r.out.find(": NOT CHECKED ("), std::string::npos) << r.out;
    const TrainConfig c = load_train_config(rel);
    if (c.parallel.cp > 1) EXPECT_NE(r.out.find("supported (CP support check passed)"), std::string::npos) << r.out;
    ++checked;
  }
  std::filesystem::current_path(cwd);
  EXPECT_GE(checked, 8);
}

TEST(CliCheckConfig, MissingDataFilesAreNotedNotFatal) {
  ConfigCase c("data:\n  source: shards\n  path: /nonexistent/fineweb_train_*.bin\n");
  const auto r = run({"check-config", c.path});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(r.out.rfind(c.path + ": config valid, NOT fully checked (data files could not be checked here; train may "
                                 "refuse it)\n",
                        0),
            0u)
      << r.out;
  EXPECT_NE(r.out.find("  data files: NOT CHECKED ("), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("/nonexistent"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find(": OK"), std::string::npos) << r.out;
  // ... and train does refuse it (unreadable data: exit 3).
  EXPECT_EQ(run({"train", c.path}).code, kExitData);
}

TEST(CliCheckConfig, NeverSaysOkForWhatItCouldNotCheck) {
  // Held-out files that are not there.
  ConfigCase text("data:\n  source: text\n  path: " + (repo_root() / "README.md").string() +
                  "\nrun:\n  eval_path: /nonexistent/held_out.txt\n");
  auto r = run({"check-config", text.path});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(r.out.rfind(text.path + ": config valid, NOT fully checked (held-out files could not", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("  data files: OK ("), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  held-out files: NOT CHECKED ("), std::string::npos) << r.out;
  // A CUDA config (and --gpus, which needs NCCL): checked where this build and machine have them.
  ConfigCase gpu("run:\n  device: cuda\n");
  r = run({"check-config", gpu.path, "--gpus", "2"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  const bool cuda = has_device_backend(DeviceType::cuda) && device_backend(DeviceType::cuda).device_count() > 0;
  if (!cuda) {
    EXPECT_EQ(r.out.rfind(gpu.path + ": config valid, NOT fully checked (cuda device", 0), 0u) << r.out;
    EXPECT_NE(r.out.find("  cuda device: NOT CHECKED (run.device=cuda: "), std::string::npos) << r.out;
    const auto t = run({"train", gpu.path, "--gpus", "2"});
    EXPECT_EQ(t.code, kExitError);
    EXPECT_NE(t.err.find("run.device=cuda: "), std::string::npos) << t.err;
  } else {
    EXPECT_NE(r.out.find("  cuda device: OK ("), std::string::npos) << r.out;
  }
  if (!dist::has_launch_backend(dist::Backend::nccl)) {
    EXPECT_NE(r.out.find("  nccl backend: NOT CHECKED (this build has no NCCL backend"), std::string::npos) << r.out;
  }
}

TEST(CliDocs, ConfigMarkdownHoldsExactlyTheGeneratedTable) {
  const std::string table = config_docs_markdown();
  const std::string doc = read_file(repo_root() / "docs" / "config.md");
  const size_t at = doc.find(table);
  ASSERT_NE(at, std::string::npos) << "docs/config.md is out of date: regenerate its table with `cpformer docs`";
  // Exactly one copy: no stale key rows elsewhere in the page.
  auto count = [](const std::string& text, const std::string& what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  for (const char* section : {"run", "model", "optimizer", "schedule", "data", "parallel", "attention", "fp8"}) {
    const std::string row = std::string("\n| `") + section + ".";
    EXPECT_EQ(count(doc, row), count(table, row)) << section;
  }
  const auto r = run({"docs"});
  EXPECT_EQ(r.code, kExitOk);
  EXPECT_EQ(r.out, table);
  // Every key of every section is in the table.
  for (const char* key : {"`run.target_accuracy`", "`model.num_kv_heads`", "`optimizer.lr`", "`schedule.warmup_steps`",
                          "`data.pad_multiple`", "`parallel.cp_comm_type`", "`run.precision`", "`run.device`",
                          "`attention.backend`", "`attention.deterministic`"}) {
    EXPECT_NE(table.find(key), std::string::npos) << key;
  }
}

TEST(CliConfig, EffectiveConfigRoundTrips) {
  const TrainConfig c = load_train_config((repo_root() / "configs" / "default.yaml").string());
  const std::string yaml = to_yaml(c);
  const TrainConfig back = load_train_config_string(yaml, "effective.yaml");
  EXPECT_EQ(to_yaml(back), yaml);
  EXPECT_EQ(back.model.vocab_size, 14);  // resolved from the synthetic task
  EXPECT_EQ(back.run.out_dir, c.run.out_dir);
}

}  // namespace
}  // namespace cpf::trainer
