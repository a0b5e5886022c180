// A run folder that cannot take checkpoints is refused before step 1 (run_folder.h,
// check_checkpoints_writable), not at the first checkpoint after the training work: checkpoints/ that is
// a file, and a run.out_dir whose checkpoint paths exceed the file system's path limit. The tests run as
// root in CI, where a read-only mode does not stop writes, so these are the failures a root user meets too.
#include <gtest/gtest.h>

#include <fstream>

#include "apps/trainer/trainer.h"
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

}  // namespace
}  // namespace cpf::trainer
