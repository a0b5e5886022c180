// A run folder that cannot take checkpoints is refused before step 1 (run_folder.h,
// check_checkpoints_writable), not at the first checkpoint after the training work: checkpoints/ that is
// a file, and a run.out_dir whose checkpoint paths exceed the file system's path limit; too little free
// space for the checkpoints is warned of. The tests run as
// root in CI, where a read-only mode does not stop writes, so these are the failures a root user meets too.
#include <gtest/gtest.h>

#include <fstream>
#include <optional>
#include <string>

#include "apps/run/run_folder.h"
#include "apps/trainer/trainer.h"
#include "models/memory_model.h"
#include "support/test_utils.h"
#include "tests/apps/cli_support.h"

namespace cpf::trainer {
namespace {

using testing::addition_yaml;
using testing::scratch_dir;

TrainOutcome train_in(const std::filesystem::path& dir) {
  const TrainConfig c = load_train_config_string(addition_yaml(dir, 2), "folder.yaml", {});
  std::ostringstream out;
  return train(c, out);
}

TEST(CheckpointFolder, ACheckpointsFileIsRefusedBeforeStepOne) {
  const auto dir = scratch_dir("checkpoints_is_a_file");
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "checkpoints") << "not a folder";
  EXPECT_CPF_ERROR(train_in(dir), "run folder: cannot create the checkpoint folder");
  EXPECT_CPF_ERROR(train_in(dir), "checked before step 1, so no training is lost");
  EXPECT_FALSE(std::filesystem::exists(dir / "metrics.jsonl") && std::filesystem::file_size(dir / "metrics.jsonl") > 0)
      << "no step may run";
}

TEST(CheckpointFolder, AnOutDirTooLongForCheckpointPathsIsRefusedBeforeStepOne) {
  // Folders of 200 characters until the run folder itself still fits the 4096-byte path limit but a
  // checkpoint's files would not.
  std::filesystem::path dir = scratch_dir("long");
  while (dir.string().size() < 4096 - 20) {
    const size_t room = 4096 - 20 - dir.string().size();
    dir /= std::string(std::min<size_t>(200, std::max<size_t>(room, 1)), 'd');
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) GTEST_SKIP() << "this file system refuses the long folder itself: " << ec.message();
  EXPECT_CPF_ERROR(train_in(dir), "run folder: cannot write checkpoints in ");
}

// A file system with less room than the checkpoints the run keeps at once is named before step 1 (a
// warning: the run may still stop early, or free space may appear): the sizes and the fixes.
TEST(CheckpointFolder, TooLittleFreeSpaceForTheCheckpointsIsWarnedBeforeStepOne) {
  const auto dir = scratch_dir("space");
  TrainConfig c = load_train_config_string(addition_yaml(dir, 20), "space.yaml", {});
  c.run.checkpoint_every = 5;  // 4 written (and one at the end), keep_checkpoints 2: 3 at once
  c.run.keep_checkpoints = 2;
  const double one = static_cast<double>(models::count_parameters(c.model)) * 4 * 3;  // f32 weights, AdamW moments
  EXPECT_EQ(checkpoint_space_warning(c, static_cast<uint64_t>(3 * one)), std::nullopt);
  const std::optional<std::string> warning = checkpoint_space_warning(c, static_cast<uint64_t>(3 * one) - 1);
  ASSERT_TRUE(warning.has_value());
  EXPECT_NE(warning->find("checkpoints: each holds about "), std::string::npos) << *warning;
  EXPECT_NE(warning->find("up to 3 at once"), std::string::npos) << *warning;
  EXPECT_NE(warning->find("lower run.keep_checkpoints or raise run.checkpoint_every"), std::string::npos) << *warning;
  c.run.keep_checkpoints = 0;  // all kept: 5
  EXPECT_NE(checkpoint_space_warning(c, static_cast<uint64_t>(3 * one))->find("up to 5 at once"), std::string::npos);
  // Asked of the system: this machine has room for a model of this size.
  EXPECT_EQ(checkpoint_space_warning(c), std::nullopt);
}

}  // namespace
}  // namespace cpf::trainer
