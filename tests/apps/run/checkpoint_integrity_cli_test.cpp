// cpformer and checkpoint integrity: a resume skips a corrupted checkpoint with a warning naming it
// and continues from the previous one; a non-finite model is neither saved by the trainer nor
// prompted by generate; a corrupted checkpoint is refused by generate.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "apps/run/checkpointing.h"
#include "framework/autograd/grad_mode.h"
#include "framework/io/checkpoint_meta.h"
#include "framework/io/file_io.h"
#include "framework/optim/adamw.h"
#include "models/gpt.h"
#include "support/test_utils.h"
#include "tests/apps/cli_support.h"

namespace cpf::trainer {
namespace {

namespace fs = std::filesystem;
using testing::repo_root;
using testing::run;
using testing::scratch_dir;

// tiny.yaml into `dir` with a checkpoint every 10 of its 20 steps.
testing::CliResult train_tiny(const fs::path& dir) {
  return run({"train", (repo_root() / "configs" / "tiny.yaml").string(), "--set", "run.out_dir=" + dir.string(),
              "--set", "run.threads=1", "--set", "run.checkpoint_every=10", "--set", "run.keep_checkpoints=0"});
}

void flip_bit(const fs::path& file, uint64_t byte, int bit) {
  std::string bytes = io::read_file(file.string());
  bytes[byte] = static_cast<char>(bytes[byte] ^ (1 << bit));
  io::write_file(file.string(), bytes, false);
}

// Rewrites a checkpoint's model with `weights` and re-signs meta.json, as if it had been saved so.
void rewrite_model(const fs::path& checkpoint, const io::NamedTensors& weights) {
  const std::string meta_path = (checkpoint / "meta.json").string();
  io::CheckpointMetaFile mf = io::parse_checkpoint_meta(io::read_file(meta_path));
  mf.checksums["model.safetensors"] = io::save_safetensors((checkpoint / "model.safetensors").string(), weights);
  io::write_file(meta_path, io::checkpoint_meta_json(mf), false);
}

TEST(CheckpointIntegrityCli, ResumeSkipsACorruptedCheckpointWithAWarningAndUsesThePreviousOne) {
  const auto dir = scratch_dir("run");
  ASSERT_EQ(train_tiny(dir).code, 0);
  const fs::path newest = dir / "checkpoints" / "step_00000020";
  const fs::path previous = dir / "checkpoints" / "step_00000010";
  const fs::path model = newest / "model.safetensors";
  flip_bit(model, fs::file_size(model) - 100, 3);  // one bit of the last tensor's data

  ::testing::internal::CaptureStderr();
  const auto r = train_tiny(dir);
  const std::string warnings = ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(warnings.find("checkpoint: skipping " + newest.string() + ": model.safetensors: tensor '"),
            std::string::npos)
      << warnings;
  EXPECT_NE(warnings.find("' fails its checksum (meta.json records "), std::string::npos) << warnings;
  EXPECT_NE(r.out.find("resumed from " + previous.string() + " at step 10"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("done: step 20/20"), std::string::npos) << r.out;
  // The run wrote step 20 again, whole: it loads and generate takes it.
  const auto g = run({"generate", dir.string(), "--prompt", "3+4=", "--tokens", "2"});
  EXPECT_EQ(g.code, 0) << g.err;
}

TEST(CheckpointIntegrityCli, GenerateRefusesACorruptedOrNonFiniteCheckpoint) {
  const auto dir = scratch_dir("run");
  ASSERT_EQ(train_tiny(dir).code, 0);
  const fs::path checkpoint = dir / "checkpoints" / "step_00000020";
  const fs::path model = checkpoint / "model.safetensors";
  const std::string original = io::read_file(model.string());
  flip_bit(model, original.size() - 7, 6);
  auto r = run({"generate", dir.string(), "--prompt", "3+4="});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("cpformer: error: load_checkpoint: " + checkpoint.string() + ": model.safetensors: tensor '"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("' fails its checksum"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << "no digits printed: " << r.out;

  // A model with a NaN weight whose checksums agree (saved before saves were checked, or by hand).
  io::write_file(model.string(), original, false);
  io::NamedTensors weights = io::load_safetensors(model.string());
  weights[3].second.data<float>()[2] = std::numeric_limits<float>::quiet_NaN();
  rewrite_model(checkpoint, weights);
  r = run({"generate", dir.string(), "--prompt", "3+4="});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("model.safetensors: tensor '" + weights[3].first +
                       "' holds 1 non-finite value (the first, nan, at element 2); a checkpoint of non-finite values "
                       "cannot be used"),
            std::string::npos)
      << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

TEST(CheckpointIntegrityCli, GenerateRefusesNonFiniteLogitsOfFiniteWeights) {
  const auto dir = scratch_dir("run");
  ASSERT_EQ(train_tiny(dir).code, 0);
  const fs::path checkpoint = dir / "checkpoints" / "step_00000020";
  // Finite but enormous MLP output weights of both signs: the residual stream overflows to inf and NaN.
  io::NamedTensors weights = io::load_safetensors((checkpoint / "model.safetensors").string());
  for (auto& [name, t] : weights) {
    if (name.find("mlp.fc_out") == std::string::npos) continue;
    float* p = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = i % 3 == 0 ? 3e38f : -3e38f;
  }
  rewrite_model(checkpoint, weights);
  const auto r = run({"generate", checkpoint.string(), "--prompt", "3+4=", "--tokens", "3"});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("generate: the model of " + checkpoint.string() +
                       " gives non-finite logits after 4 tokens; refusing to sample from them"),
            std::string::npos)
      << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

// The trainer's save refuses non-finite weights and keeps what the folder holds.
TEST(CheckpointIntegrityCli, TheTrainerRefusesToSaveNonFiniteWeights) {
  const auto dir = scratch_dir("run");
  ASSERT_EQ(train_tiny(dir).code, 0);
  TrainConfig config = load_train_config((repo_root() / "configs" / "tiny.yaml").string());
  config.run.out_dir = dir.string();
  config.run.keep_checkpoints = 1;
  models::GPT model(config.model);
  optim::AdamW optimizer(model.named_parameters(), {});
  const std::string before = find_resume_checkpoint(config, model.named_parameters(), optimizer).value_or("");
  ASSERT_EQ(before, (dir / "checkpoints" / "step_00000020").string());
  load_training_checkpoint(before, config, model.named_parameters(), optimizer);
  const io::NamedTensors params = model.named_parameters();
  const auto& [name, weight] = params.front();
  {
    NoGradGuard no_grad;
    weight.data<float>()[0] = std::numeric_limits<float>::infinity();
  }
  EXPECT_CPF_ERROR(save_training_checkpoint(config, model.named_parameters(), optimizer, 21, {}),
                   "save_checkpoint: refusing to write step 21 into " + (dir / "checkpoints").string() +
                       ": model parameter tensor '" + name +
                       "' holds 1 non-finite value (the first, inf, at element 0); the checkpoints already there are "
                       "kept (newest: " +
                       before + ")");
  EXPECT_EQ(io::list_checkpoints((dir / "checkpoints").string()),
            (std::vector<std::string>{(dir / "checkpoints" / "step_00000010").string(), before}))
      << "keep_checkpoints=1 rotated nothing out";
}

}  // namespace
}  // namespace cpf::trainer
