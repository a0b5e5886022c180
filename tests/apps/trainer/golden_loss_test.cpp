// Golden end-to-end losses: the first 10 steps of a fixed small training run, checked in under
// tests/golden/. They pin the whole numeric path (data, init, attention, MLP, loss, AdamW, schedule),
// so an unintended change anywhere shows up here even when every unit test still passes.
//
// How the file was produced: `tests/apps_golden_loss_test --print > tests/golden/tiny_addition_losses.txt`
// on the development machine (Release, generic x86-64, one thread per rank). Regenerate it the same
// way when a change is MEANT to move the numbers, and say why in the commit.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "apps/trainer/trainer.h"
#include "tests/apps/cli_support.h"

namespace cpf::trainer {
namespace {

// One-digit addition, the tiny model, one rank and cp = 2 ring attention (the default job's layout).
// Its own folder under the temp dir (also used by --print, outside any test).
std::filesystem::path run_dir(int64_t cp) {
  const auto dir = std::filesystem::temp_directory_path() / "cpformer_tests" / ("golden_cp" + std::to_string(cp));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::vector<double> golden_run(int64_t cp) {
  const std::string yaml =
      "run:\n  out_dir: " + run_dir(cp).string() +
      "\n  steps: 10\n  log_every: 1\n  eval_every: 0\n  eval_batches: 1\n  eval_examples: 8\n  threads: 1\n"
      "model:\n  hidden_size: 32\n  num_layers: 2\n  num_heads: 4\n"
      "optimizer:\n  lr: 0.003\n"
      "schedule:\n  warmup_steps: 2\n  total_steps: 20\n"
      "data:\n  min_len: 1\n  max_len: 1\n  seq_len: 16\n  tokens_per_batch: 128\n  pad_multiple: 8\n"
      "parallel:\n  cp: " +
      std::to_string(cp) + "\n";
  const TrainConfig c = load_train_config_string(yaml, "golden.yaml");
  std::ostringstream out;
  return train(c, out).losses;
}

std::vector<double> checked_in() {
  std::ifstream in(testing::repo_root() / "tests" / "golden" / "tiny_addition_losses.txt");
  std::vector<double> losses;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    losses.push_back(std::stod(line));
  }
  return losses;
}

TEST(GoldenLosses, TinyAdditionRunMatchesTheCheckedInLosses) {
  const auto golden = checked_in();
  ASSERT_EQ(golden.size(), 10u) << "tests/golden/tiny_addition_losses.txt is missing or incomplete";
  for (int64_t cp : {1, 2}) {
    const auto losses = golden_run(cp);
    ASSERT_EQ(losses.size(), golden.size());
    for (size_t i = 0; i < golden.size(); ++i) {
      EXPECT_LE(std::abs(losses[i] - golden[i]), 1e-5 * std::abs(golden[i]))
          << "cp=" << cp << " step " << i + 1 << ": loss " << losses[i] << " vs golden " << golden[i];
    }
  }
}

}  // namespace
}  // namespace cpf::trainer

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--print") {
    std::cout << "# Losses of the first 10 steps of tests/apps/trainer/golden_loss_test.cpp's run (one rank).\n"
                 "# Produced by `apps_golden_loss_test --print`; see that file for when to regenerate.\n";
    for (double loss : cpf::trainer::golden_run(1)) std::cout << std::setprecision(9) << loss << "\n";
    return 0;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
