#pragma once
// Helpers for the cpformer CLI tests: run the CLI in-process with captured output, scratch folders,
// the repository root (configs/, docs/).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "apps/cli/cli.h"
#include "apps/trainer/trainer.h"
#include "support/scratch_dir.h"

namespace cpf::trainer::testing {

struct CliResult {
  int code = -1;
  std::string out;
  std::string err;
};

inline CliResult run(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  CliResult r;
  r.code = run_cli(args, out, err, false);
  r.out = out.str();
  r.err = err.str();
  return r;
}

// The repository files these tests read (configs/, README.md, docs/*.md, tests/golden/*.txt), copied by
// the build into tests/inputs next to the test binaries (tests/CMakeLists.txt, target cpf_test_inputs):
// found from the running binary, so the tests run wherever the build tree is, without the sources.
inline std::filesystem::path repo_root() {
  static const std::filesystem::path inputs = std::filesystem::canonical("/proc/self/exe").parent_path() / "inputs";
  EXPECT_TRUE(std::filesystem::is_directory(inputs)) << inputs << " is missing: build the cpf_test_inputs target";
  return inputs;
}

// A fresh, empty folder under the system temp dir, unique per test.
inline std::filesystem::path scratch_dir(const std::string& name) { return cpf::testing::scratch_dir(name); }

inline void write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// A training config of one-digit addition (the job of configs/tiny.yaml): a 2-layer 32-wide model,
// 128-token batches padded to 8 (cp up to 4), one thread, a loss line every step, no evaluation until
// the end, writing to out_dir.
inline std::string addition_yaml(const std::filesystem::path& out_dir, int64_t steps) {
  return "run:\n  out_dir: " + out_dir.string() + "\n  steps: " + std::to_string(steps) +
         "\n  log_every: 1\n  eval_every: 0\n  eval_batches: 1\n  eval_examples: 8\n  threads: 1\n"
         "model:\n  hidden_size: 32\n  num_layers: 2\n  num_heads: 4\n"
         "optimizer:\n  lr: 0.003\n"
         "schedule:\n  warmup_steps: 2\n  total_steps: 20\n"
         "data:\n  min_len: 1\n  max_len: 1\n  seq_len: 16\n  tokens_per_batch: 128\n  pad_multiple: 8\n";
}

// Trains addition_yaml(out_dir, steps) with `overrides` ("a.b=c") in-process, its console discarded.
inline TrainOutcome train_addition(const std::filesystem::path& out_dir, int64_t steps,
                                   const std::vector<std::string>& overrides = {}) {
  const TrainConfig c = load_train_config_string(addition_yaml(out_dir, steps), "addition.yaml", overrides);
  std::ostringstream out;
  return train(c, out);
}

}  // namespace cpf::trainer::testing
