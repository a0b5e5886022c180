// Checkpoint integrity: per-tensor checksums catch every flipped bit, non-finite values are never
// saved nor loaded, rotation keeps the last finite checkpoint, format-1 checkpoints still load.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>

#include "framework/autograd/grad_mode.h"
#include "framework/autograd/ops.h"
#include "framework/io/checkpoint.h"
#include "framework/io/checkpoint_meta.h"
#include "framework/io/file_io.h"
#include "framework/nn/linear.h"
#include "framework/optim/adamw.h"
#include "support/test_utils.h"
#include "tests/io/checkpoint_test_net.h"

namespace cpf {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using testing::Net;
using testing::snapshot;
using testing::train_step;

void set_element(const Tensor& t, int64_t index, float value) {
  NoGradGuard no_grad;
  t.data<float>()[index] = value;
}

io::CheckpointMeta meta_at(int64_t step) { return {.step = step, .config_hash = "cfg"}; }

void flip_bit(const fs::path& file, uint64_t byte, int bit) {
  std::string bytes = io::read_file(file.string());
  bytes[byte] = static_cast<char>(bytes[byte] ^ (1 << bit));
  io::write_file(file.string(), bytes, false);
}

// Rewrites meta.json as format version 1 wrote it: no checksums.
void make_format_1(const std::string& checkpoint) {
  const std::string path = checkpoint + "/meta.json";
  json j = json::parse(io::read_file(path));
  j.erase("checksum_algorithm");
  j.erase("checksums");
  j.erase("meta_checksum");
  j["version"] = 1;
  io::write_file(path, j.dump(2) + "\n", false);
}

class CheckpointIntegrity : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("cpf_ckpt_integrity_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    train_step(net_, opt_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir() const { return dir_.string(); }
  std::string step_dir(int64_t step) const { return (dir_ / io::checkpoint_dir_name(step)).string(); }
  std::string problem(int64_t step, io::CheckDepth depth = io::CheckDepth::data) {
    return io::checkpoint_problem(step_dir(step), net_.named_parameters(), &opt_, "cfg", depth);
  }
  std::vector<std::string> names() const { return testing::sorted_names(dir_); }
  fs::path dir_;
  Net net_;
  optim::AdamW opt_{net_.named_parameters(), {.lr = 0.01}};
};

TEST_F(CheckpointIntegrity, MetaJsonRecordsAChecksumPerTensorOfTheBytesWritten) {
  const std::string saved = io::save_checkpoint(dir(), net_.named_parameters(), &opt_, meta_at(1));
  const json j = json::parse(io::read_file(saved + "/meta.json"));
  EXPECT_EQ(j["version"], 2);
  EXPECT_EQ(j["checksum_algorithm"], "xxh3-64");
  EXPECT_EQ(j["checksums"]["model.safetensors"].size(), 4u);
  EXPECT_EQ(j["checksums"]["optimizer.safetensors"].size(), opt_.state_tensors().size());
  const Tensor w = net_.fc1->weight();
  EXPECT_EQ(j["checksums"]["model.safetensors"]["fc1.weight"],
            io::tensor_checksum(w.raw_data(), static_cast<size_t>(w.numel()) * 4));
  EXPECT_EQ(io::tensor_checksum("", 0), "2d06800538d394c2");  // XXH3-64 of no bytes, the reference value
  EXPECT_EQ(problem(1), "");
}

TEST_F(CheckpointIntegrity, AFlippedDataBitIsCaughtAndThePreviousCheckpointIsUsed) {
  io::save_checkpoint(dir(), net_.named_parameters(), &opt_, meta_at(1));
  const auto at_step_1 = snapshot(net_.named_parameters());
  train_step(net_, opt_);
  io::save_checkpoint(dir(), net_.named_parameters(), &opt_, meta_at(2));
  const fs::path model = fs::path(step_dir(2)) / "model.safetensors";
  flip_bit(model, fs::file_size(model) - 3, 4);  // inside fc2.bias, the last tensor

  EXPECT_EQ(problem(2, io::CheckDepth::headers), "") << "the headers alone cannot see it";
  EXPECT_THAT(problem(2),
              ::testing::MatchesRegex("model.safetensors: tensor 'fc2.bias' fails its checksum \\(meta.json "
                                      "records [0-9a-f]{16}, the data hashes to [0-9a-f]{16}\\): the file is "
                                      "corrupted"));
  Net fresh(4, 9);
  optim::AdamW fresh_opt(fresh.named_parameters(), {});
  const auto before = snapshot(fresh.named_parameters());
  EXPECT_CPF_ERROR(io::load_checkpoint(step_dir(2), fresh.named_parameters(), &fresh_opt, "cfg"),
                   "load_checkpoint: " + step_dir(2) + ": model.safetensors: tensor 'fc2.bias' fails its checksum");
  EXPECT_EQ(snapshot(fresh.named_parameters()), before) << "nothing copied";

  ::testing::internal::CaptureStderr();
  const auto found = io::find_latest_valid(dir(), fresh.named_parameters(), &fresh_opt, "cfg");
  const std::string warnings = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(*found, step_dir(1));
  EXPECT_NE(warnings.find("checkpoint: skipping " + step_dir(2) +
                          ": model.safetensors: tensor 'fc2.bias' fails its "
                          "checksum"),
            std::string::npos)
      << warnings;
  io::load_checkpoint(*found, fresh.named_parameters(), &fresh_opt, "cfg");
  EXPECT_EQ(snapshot(fresh.named_parameters()), at_step_1);
}

TEST_F(CheckpointIntegrity, AFlippedOptimizerBitIsCaught) {
  io::save_checkpoint(dir(), net_.named_parameters(), &opt_, meta_at(1));
  const fs::path file = fs::path(step_dir(1)) / "optimizer.safetensors";
  flip_bit(file, fs::file_size(file) - 1, 0);
  EXPECT_NE(problem(1).find("optimizer.safetensors: tensor '"), std::string::npos) << problem(1);
  EXPECT_NE(problem(1).find("' fails its checksum"), std::string::npos);
  // Weights only (generate) reads the model file alone, which is intact.
  EXPECT_EQ(io::checkpoint_problem(step_dir(1), net_.named_parameters(), nullptr, "", io::CheckDepth::data), "");
}

// No single flipped bit anywhere in the model file or meta.json loads silently.
TEST_F(CheckpointIntegrity, EveryFlippedBitOfModelFileAndMetaIsDetected) {
  const std::string saved = io::save_checkpoint(dir(), net_.named_parameters(), nullptr, meta_at(1));
  for (const char* name : {"model.safetensors", "meta.json"}) {
    const fs::path file = fs::path(saved) / name;
    const std::string original = io::read_file(file.string());
    for (uint64_t byte = 0; byte < original.size(); ++byte) {
      const int bit = static_cast<int>((byte * 5) % 8);
      flip_bit(file, byte, bit);
      EXPECT_NE(io::checkpoint_problem(saved, net_.named_parameters(), nullptr, "cfg", io::CheckDepth::data), "")
          << name << " byte " << byte << " bit " << bit << " in \"" << original.substr(byte > 12 ? byte - 12 : 0, 24)
          << "\"";
      io::write_file(file.string(), original, false);
    }
  }
  EXPECT_EQ(io::checkpoint_problem(saved, net_.named_parameters(), nullptr, "cfg", io::CheckDepth::data), "");
}

TEST_F(CheckpointIntegrity, AModifiedMetaJsonFailsItsOwnChecksum) {
  io::save_checkpoint(dir(), net_.named_parameters(), &opt_, {.step = 1, .rng_offset = 1234, .config_hash = "cfg"});
  const std::string path = step_dir(1) + "/meta.json";
  std::string text = io::read_file(path);
  text.replace(text.find("\"rng_offset\": 1234"), 18, "\"rng_offset\": 1235");  // one bit: '4' -> '5'
  io::write_file(path, text, false);
  EXPECT_THAT(problem(1, io::CheckDepth::headers),
              ::testing::MatchesRegex("meta.json fails its checksum \\(records [0-9a-f]{16}, its contents hash to "
                                      "[0-9a-f]{16}\\): the file was modified or corrupted"));
  // Re-indenting is not a modification: the checksum is over the canonical JSON.
  io::write_file(path, json::parse(io::read_file(path)).dump(), false);
  EXPECT_NE(problem(1), "");
  text.replace(text.find("\"rng_offset\": 1235"), 18, "\"rng_offset\": 1234");
  io::write_file(path, json::parse(text).dump(4), false);
  EXPECT_EQ(problem(1), "");
  EXPECT_EQ(io::read_checkpoint_meta(step_dir(1)).rng_offset, 1234u);
  const std::string valid = io::read_file(path);
  io::write_file(path, valid + std::string(1, '\0') + "{", false);
  EXPECT_EQ(problem(1, io::CheckDepth::headers),
            "meta.json holds a NUL byte at offset " + std::to_string(valid.size()) + " (corrupt file)");
}

TEST_F(CheckpointIntegrity, ChecksumEntriesMustMatchTheTensors) {
  io::save_checkpoint(dir(), net_.named_parameters(), &opt_, meta_at(1));
  const std::string path = step_dir(1) + "/meta.json";
  const std::string original = io::read_file(path);
  auto with = [&](const std::function<void(json&)>& edit) {
    json j = json::parse(original);
    edit(j);
    io::CheckpointMetaFile mf = io::parse_checkpoint_meta(original);  // re-sign the edited content
    mf.checksums = j["checksums"].get<std::map<std::string, io::TensorChecksums>>();
    io::write_file(path, io::checkpoint_meta_json(mf), false);
    return problem(1, io::CheckDepth::headers);
  };
  EXPECT_EQ(with([](json& j) { j["checksums"]["model.safetensors"].erase("fc1.bias"); }),
            "meta.json records no checksum for tensor 'fc1.bias' of model.safetensors");
  EXPECT_EQ(with([](json& j) { j["checksums"]["model.safetensors"]["extra"] = "0000000000000000"; }),
            "meta.json records checksums of 5 tensors for model.safetensors, which holds 4");
  EXPECT_EQ(with([](json& j) { j["checksums"].erase("optimizer.safetensors"); }),
            "meta.json records no checksums for optimizer.safetensors");
  EXPECT_EQ(with([](json& j) { j["checksums"]["model.safetensors"]["fc1.bias"] = "XYZ"; }),
            "meta.json: checksum of 'fc1.bias' in 'model.safetensors' must be 16 lower-case hex digits, got \"XYZ\"");
  json bad = json::parse(original);
  bad["checksums"]["model.safetensors"]["fc1.bias"] = "XYZ";
  io::write_file(path, bad.dump(2), false);
  EXPECT_EQ(problem(1, io::CheckDepth::headers).substr(0, 27), "meta.json fails its checksu");
  bad.erase("meta_checksum");
  io::write_file(path, bad.dump(2), false);
  EXPECT_EQ(problem(1, io::CheckDepth::headers), "meta.json has no string field 'meta_checksum'");
}

TEST_F(CheckpointIntegrity, NonFiniteParametersOrStateAreNeverSavedAndRotationKeepsTheFiniteOnes) {
  io::save_checkpoint(dir(), net_.named_parameters(), &opt_, meta_at(1), 1);
  io::save_checkpoint(dir(), net_.named_parameters(), &opt_, meta_at(2), 1);
  set_element(net_.fc1->weight(), 5, std::numeric_limits<float>::quiet_NaN());
  set_element(net_.fc1->weight(), 7, std::numeric_limits<float>::infinity());
  EXPECT_CPF_ERROR(io::save_checkpoint(dir(), net_.named_parameters(), &opt_, meta_at(3), 1),
                   "save_checkpoint: refusing to write step 3 into " + dir() +
                       ": model parameter tensor 'fc1.weight' holds 2 non-finite values (the first, nan, at element "
                       "5); the checkpoints already there are kept (newest: " +
                       step_dir(2) + ")");
  EXPECT_EQ(names(), std::vector<std::string>{"step_00000002"}) << "no rotation, no temporary folder";
  EXPECT_FALSE(io::all_finite(net_.named_parameters()));

  set_element(net_.fc1->weight(), 5, 0.5f);
  set_element(net_.fc1->weight(), 7, 0.5f);
  const Tensor exp_avg_sq = opt_.state_tensors().back().second;
  set_element(exp_avg_sq, 0, -std::numeric_limits<float>::infinity());
  EXPECT_CPF_ERROR(io::save_checkpoint(dir(), net_.named_parameters(), &opt_, meta_at(4), 1),
                   "optimizer state tensor '" + opt_.state_tensors().back().first +
                       "' holds 1 non-finite value (the first, -inf, at element 0)");
  // Weights only: the optimizer's state is not part of it, so it saves.
  io::save_checkpoint(dir(), net_.named_parameters(), nullptr, meta_at(4));
  EXPECT_EQ(names(), (std::vector<std::string>{"step_00000002", "step_00000004"}));
  fs::remove_all(dir_);
  EXPECT_CPF_ERROR(io::save_checkpoint(dir(), net_.named_parameters(), &opt_, meta_at(5)),
                   "the checkpoints already there are kept (there are none)");
}

// A checkpoint holding NaN (hand-made, or written before saves were checked) is skipped on resume
// and refused by load, whatever its checksums say.
TEST_F(CheckpointIntegrity, NonFiniteCheckpointsAreSkippedAndRefused) {
  io::save_checkpoint(dir(), net_.named_parameters(), &opt_, meta_at(1));
  io::save_checkpoint(dir(), net_.named_parameters(), &opt_, meta_at(2));
  // Rewrite step 2's model with a NaN and re-sign it, so only the finite check can object.
  Net poisoned;
  set_element(poisoned.fc2->weight(), 3, std::numeric_limits<float>::quiet_NaN());
  io::CheckpointMetaFile mf = io::parse_checkpoint_meta(io::read_file(step_dir(2) + "/meta.json"));
  mf.checksums["model.safetensors"] =
      io::save_safetensors(step_dir(2) + "/model.safetensors", poisoned.named_parameters());
  io::write_file(step_dir(2) + "/meta.json", io::checkpoint_meta_json(mf), false);

  const std::string expected =
      "model.safetensors: tensor 'fc2.weight' holds 1 non-finite value (the first, nan, at element 3); a checkpoint "
      "of non-finite values cannot be used";
  EXPECT_EQ(problem(2), expected);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(io::find_latest_valid(dir(), net_.named_parameters(), &opt_, "cfg"), step_dir(1));
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("skipping " + step_dir(2) + ": " + expected),
            std::string::npos);
  EXPECT_CPF_ERROR(io::load_checkpoint(step_dir(2), net_.named_parameters(), nullptr, ""), expected);
}

TEST_F(CheckpointIntegrity, Format1CheckpointsWithoutChecksumsStillLoadWithANote) {
  const std::string saved = io::save_checkpoint(dir(), net_.named_parameters(), &opt_, meta_at(1));
  make_format_1(saved);
  Net fresh(4, 4);
  optim::AdamW fresh_opt(fresh.named_parameters(), {});
  EXPECT_EQ(io::find_latest_valid(dir(), fresh.named_parameters(), &fresh_opt, "cfg"), saved);
  ::testing::internal::CaptureStderr();
  io::load_checkpoint(saved, fresh.named_parameters(), &fresh_opt, "cfg");
  EXPECT_NE(::testing::internal::GetCapturedStderr().find(
                "checkpoint: " + saved +
                " has no checksums (format version 1, written before they were recorded): "
                "its data is loaded unverified"),
            std::string::npos);
  EXPECT_EQ(snapshot(fresh.named_parameters()), snapshot(net_.named_parameters()));
  // Their non-finite values are still refused.
  set_element(net_.fc1->bias(), 1, std::numeric_limits<float>::quiet_NaN());
  io::save_safetensors(saved + "/model.safetensors", net_.named_parameters());
  EXPECT_CPF_ERROR(io::load_checkpoint(saved, fresh.named_parameters(), nullptr, ""),
                   "model.safetensors: tensor 'fc1.bias' holds 1 non-finite value (the first, nan, at element 1)");
}

}  // namespace
}  // namespace cpf
