#include <gtest/gtest.h>

#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "framework/autograd/ops.h"
#include "framework/io/checkpoint.h"
#include "framework/io/file_io.h"
#include "framework/nn/linear.h"
#include "framework/optim/adamw.h"
#include "framework/optim/sgd.h"
#include "support/test_utils.h"
#include "tests/io/checkpoint_test_net.h"

namespace cpf {
namespace {

namespace fs = std::filesystem;

using testing::Net;
using testing::snapshot;
using testing::train_step;

// meta.json as format version 1 wrote it: no checksums.
std::string format_1(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text);
  for (const char* key : {"checksum_algorithm", "checksums", "meta_checksum"}) j.erase(key);
  j["version"] = 1;
  return j.dump(2) + "\n";
}

io::CheckpointMeta meta_at(int64_t step, const std::string& hash = "cfg-1") {
  return {.step = step,
          .rng_seed = 7,
          .rng_offset = 1ull << 40,
          .data_cursor = 123,
          .config_hash = hash,
          .extra = {{"epoch", "2"}}};
}

class Checkpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("cpf_checkpoint_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir() const { return dir_.string(); }
  std::string step_dir(int64_t step) const { return (dir_ / io::checkpoint_dir_name(step)).string(); }
  std::vector<std::string> names() const { return testing::sorted_names(dir_); }
  fs::path dir_;
};

TEST_F(Checkpoint, SaveFindLoadRestoresModelOptimizerAndMeta) {
  Net net;
  optim::AdamW opt(net.named_parameters(), {.lr = 0.01});
  train_step(net, opt);
  train_step(net, opt);
  const std::string saved = io::save_checkpoint(dir(), net.named_parameters(), &opt, meta_at(2));
  EXPECT_EQ(saved, step_dir(2));
  EXPECT_EQ(names(), (std::vector<std::string>{"step_00000002"}));
  for (const char* f : {"model.safetensors", "optimizer.safetensors", "meta.json"}) {
    EXPECT_TRUE(fs::is_regular_file(fs::path(saved) / f)) << f;
  }
  EXPECT_NE(io::read_file(saved + "/meta.json").find("\"format\": \"cpformer-checkpoint\""), std::string::npos);

  Net fresh(4, 99);
  optim::AdamW fresh_opt(fresh.named_parameters(), {.lr = 0.01});
  const auto found = io::find_latest_valid(dir(), fresh.named_parameters(), &fresh_opt, "cfg-1");
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(*found, saved);
  const io::CheckpointMeta meta = io::load_checkpoint(*found, fresh.named_parameters(), &fresh_opt, "cfg-1");
  EXPECT_EQ(meta.step, 2);
  EXPECT_EQ(meta.rng_seed, 7u);
  EXPECT_EQ(meta.rng_offset, 1ull << 40);
  EXPECT_EQ(meta.data_cursor, 123);
  EXPECT_EQ(meta.config_hash, "cfg-1");
  EXPECT_EQ(meta.extra.at("epoch"), "2");
  EXPECT_EQ(meta.optimizer_name, "adamw");
  EXPECT_EQ(meta.optimizer_step, 2);
  EXPECT_EQ(fresh_opt.step_count(), 2);
  EXPECT_EQ(snapshot(fresh.named_parameters()), snapshot(net.named_parameters()));
  EXPECT_EQ(snapshot(fresh_opt.state_tensors()), snapshot(opt.state_tensors()));

  // Resumed training continues bit for bit.
  train_step(net, opt);
  train_step(fresh, fresh_opt);
  EXPECT_EQ(snapshot(fresh.named_parameters()), snapshot(net.named_parameters()));
}

TEST_F(Checkpoint, ShapeMismatchIsRejectedAndLeavesLiveTensorsUnchanged) {
  Net net;
  optim::AdamW opt(net.named_parameters(), {});
  io::save_checkpoint(dir(), net.named_parameters(), &opt, meta_at(1));
  Net wider(5, 3);
  optim::AdamW wider_opt(wider.named_parameters(), {});
  const auto before = snapshot(wider.named_parameters());
  EXPECT_CPF_ERROR(io::load_checkpoint(step_dir(1), wider.named_parameters(), &wider_opt, "cfg-1"),
                   "tensor 'fc1.weight' has shape [4,3] in model.safetensors but [5,3] in the model");
  EXPECT_EQ(snapshot(wider.named_parameters()), before);
  EXPECT_FALSE(io::find_latest_valid(dir(), wider.named_parameters(), &wider_opt, "cfg-1").has_value());
}

TEST_F(Checkpoint, CorruptOptimizerFileLeavesTheModelUnchanged) {
  Net net;
  optim::AdamW opt(net.named_parameters(), {});
  io::save_checkpoint(dir(), net.named_parameters(), &opt, meta_at(1));
  const fs::path file = fs::path(step_dir(1)) / "optimizer.safetensors";
  fs::resize_file(file, fs::file_size(file) - 4);
  Net other(4, 5);
  optim::AdamW other_opt(other.named_parameters(), {});
  const auto before = snapshot(other.named_parameters());
  EXPECT_CPF_ERROR(io::load_checkpoint(step_dir(1), other.named_parameters(), &other_opt, ""),
                   "optimizer.safetensors is 812 bytes but meta.json records 816 (incomplete or modified file)");
  EXPECT_EQ(snapshot(other.named_parameters()), before);
  // The model alone is still loadable (weights only).
  io::load_checkpoint(step_dir(1), other.named_parameters(), nullptr, "");
  EXPECT_EQ(snapshot(other.named_parameters()), snapshot(net.named_parameters()));
}

TEST_F(Checkpoint, CrashDuringSaveLeavesThePreviousCheckpointLoadable) {
  Net net;
  optim::AdamW opt(net.named_parameters(), {});
  io::save_checkpoint(dir(), net.named_parameters(), &opt, meta_at(1));
  // A save of step 2 killed mid-write: a temporary folder with a truncated file and no meta.json.
  fs::create_directories(dir_ / ".tmp-step_00000002");
  fs::copy_file(fs::path(step_dir(1)) / "model.safetensors", dir_ / ".tmp-step_00000002/model.safetensors");
  fs::resize_file(dir_ / ".tmp-step_00000002/model.safetensors", 20);
  // A step folder written by something non-atomic: meta.json present, model file cut short.
  fs::copy(step_dir(1), step_dir(3));
  std::string meta3 = format_1(io::read_file(step_dir(1) + "/meta.json"));  // edited: no checksum
  meta3.replace(meta3.find("\"step\": 1"), 9, "\"step\": 3");
  io::write_file(step_dir(3) + "/meta.json", meta3, false);
  fs::resize_file(fs::path(step_dir(3)) / "model.safetensors", 100);

  EXPECT_NE(
      io::checkpoint_problem(step_dir(3), net.named_parameters(), &opt, "cfg-1").find("model.safetensors is 100 bytes"),
      std::string::npos);
  const auto found = io::find_latest_valid(dir(), net.named_parameters(), &opt, "cfg-1");
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(*found, step_dir(1));
  io::load_checkpoint(*found, net.named_parameters(), &opt, "cfg-1");

  // The next save clears the leftover temporary folder.
  io::save_checkpoint(dir(), net.named_parameters(), &opt, meta_at(4));
  EXPECT_EQ(names(), (std::vector<std::string>{"step_00000001", "step_00000003", "step_00000004"}));
}

TEST_F(Checkpoint, KeepLastRotationAndSameStepReplacement) {
  Net net;
  optim::SGD opt(net.named_parameters(), {.lr = 0.1});
  for (int64_t step = 1; step <= 5; ++step) io::save_checkpoint(dir(), net.named_parameters(), &opt, meta_at(step), 2);
  EXPECT_EQ(names(), (std::vector<std::string>{"step_00000004", "step_00000005"}));
  // Saving an older step (resumed from it) keeps it and the newest other one.
  io::save_checkpoint(dir(), net.named_parameters(), &opt, meta_at(3), 2);
  EXPECT_EQ(names(), (std::vector<std::string>{"step_00000003", "step_00000005"}));

  // Re-saving step 5 with new weights replaces it in place, with no leftovers.
  train_step(net, opt);
  io::save_checkpoint(dir(), net.named_parameters(), &opt, meta_at(5));
  EXPECT_EQ(names(), (std::vector<std::string>{"step_00000003", "step_00000005"}));
  Net fresh(4, 8);
  optim::SGD fresh_opt(fresh.named_parameters(), {.lr = 0.1});
  io::load_checkpoint(step_dir(5), fresh.named_parameters(), &fresh_opt, "cfg-1");
  EXPECT_EQ(snapshot(fresh.named_parameters()), snapshot(net.named_parameters()));
  EXPECT_EQ(fresh_opt.step_count(), 1);
}

TEST_F(Checkpoint, ConfigHashMismatchIsRejected) {
  Net net;
  optim::AdamW opt(net.named_parameters(), {});
  io::save_checkpoint(dir(), net.named_parameters(), &opt, meta_at(1, "abc"));
  EXPECT_CPF_ERROR(io::load_checkpoint(step_dir(1), net.named_parameters(), &opt, "def"),
                   "config hash 'abc' differs from the expected 'def' (written by a different config)");
  EXPECT_FALSE(io::find_latest_valid(dir(), net.named_parameters(), &opt, "def").has_value());
  EXPECT_TRUE(io::find_latest_valid(dir(), net.named_parameters(), &opt, "").has_value());
}

TEST_F(Checkpoint, OptimizerAndTensorSetMismatchesAreRejected) {
  Net net;
  optim::AdamW adamw(net.named_parameters(), {});
  io::save_checkpoint(dir(), net.named_parameters(), nullptr, meta_at(1));
  io::save_checkpoint(dir(), net.named_parameters(), &adamw, meta_at(2));
  const std::string weights_only = step_dir(1);
  const std::string full = step_dir(2);
  auto problem = [&](const std::string& path, const optim::NamedTensors& model, const optim::Optimizer* opt) {
    return io::checkpoint_problem(path, model, opt, "cfg-1");
  };
  EXPECT_EQ(problem(weights_only, net.named_parameters(), nullptr), "");
  EXPECT_EQ(problem(weights_only, net.named_parameters(), &adamw),
            "the checkpoint holds no optimizer state (weights only)");
  optim::SGD sgd(net.named_parameters(), {});
  EXPECT_EQ(problem(full, net.named_parameters(), &sgd), "the checkpoint holds adamw state but the optimizer is sgd");

  optim::NamedTensors fewer = net.named_parameters();
  fewer.pop_back();
  EXPECT_EQ(problem(full, fewer, nullptr),
            "model.safetensors has tensor 'fc2.bias' which the model does not have (1 unexpected)");
  optim::NamedTensors more = net.named_parameters();
  more.emplace_back("head.weight", zeros({2, 2}));
  EXPECT_EQ(problem(full, more, nullptr), "model.safetensors has no tensor 'head.weight' which the model has");
  optim::NamedTensors other_dtype = net.named_parameters();
  other_dtype[0].second = zeros(other_dtype[0].second.shape(), {.dtype = DType::f64});
  EXPECT_EQ(problem(full, other_dtype, nullptr),
            "tensor 'fc1.weight' is f32 in model.safetensors but f64 in the model");
  optim::NamedTensors twice = net.named_parameters();
  twice.push_back(twice[0]);
  EXPECT_EQ(problem(full, twice, nullptr), "the model lists parameter 'fc1.weight' more than once");
  optim::AdamW small(fewer, {});
  EXPECT_EQ(problem(full, net.named_parameters(), &small),
            "optimizer.safetensors has tensor 'exp_avg.fc2.bias' which the optimizer does not have (2 unexpected)");
}

TEST_F(Checkpoint, MetaJsonProblemsAreReported) {
  Net net;
  io::save_checkpoint(dir(), net.named_parameters(), nullptr, meta_at(6));
  const std::string path = step_dir(6);
  const std::string meta_path = path + "/meta.json";
  // Field checks on a format-1 file: in format 2 any edit would fail meta.json's own checksum first
  // (checkpoint_integrity_test.cpp).
  const std::string original = format_1(io::read_file(meta_path));
  auto with_meta = [&](const std::string& from, const std::string& to) {
    std::string text = original;
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    io::write_file(meta_path, text.replace(at, from.size(), to), false);
    return io::checkpoint_problem(path, net.named_parameters(), nullptr, "");
  };
  EXPECT_EQ(with_meta("\"step\": 6", "\"step\": 7"), "folder name says step 6 but meta.json says step 7");
  EXPECT_EQ(with_meta("\"step\": 6", "\"step\": -6"), "meta.json: 'step' must be an integer >= 0, got -6");
  EXPECT_EQ(with_meta("\"version\": 1", "\"version\": 4"), "meta.json: version 4 is not supported (expected 1 to 3)");
  EXPECT_EQ(with_meta("\"version\": 1", "\"version\": 3"),
            "meta.json: version 3 needs 'shards', an integer >= 1, got (missing)");
  EXPECT_EQ(with_meta("\"cpformer-checkpoint\"", "\"other\""),
            "meta.json: format \"other\" is not \"cpformer-checkpoint\"");
  EXPECT_EQ(with_meta("\"rng_seed\": 7", "\"rng_seed\": -7"),
            "meta.json: 'rng_seed' must be an unsigned integer, got -7");
  EXPECT_EQ(with_meta("\"data_cursor\": 123", "\"data_cursor\": \"x\""),
            "meta.json: 'data_cursor' must be an integer, got \"x\"");
  EXPECT_EQ(with_meta("\"config_hash\": \"cfg-1\"", "\"config_hash\": 1"), "meta.json: 'config_hash' must be a string");
  EXPECT_EQ(with_meta("\"optimizer\": null", "\"optimizer\": 3"),
            "meta.json: 'optimizer' must be null or {\"name\": string, \"step_count\": integer >= 0}, got 3");
  EXPECT_EQ(with_meta("\"epoch\": \"2\"", "\"epoch\": 2"), "meta.json: 'extra' value of 'epoch' is not a string: 2");
  EXPECT_EQ(with_meta("\"extra\": {", "\"extra\": [{").substr(0, 22), "meta.json is not valid");
  EXPECT_EQ(with_meta("\"model.safetensors\": ", "\"model.safetensors\": -"),
            "meta.json: size of 'model.safetensors' must be an unsigned integer");
  EXPECT_EQ(with_meta("\"model.safetensors\"", "\"other.safetensors\""),
            "meta.json records no size for model.safetensors");
  EXPECT_EQ(with_meta("\"files\"", "\"fils\""), "meta.json has no field 'files'");
  io::write_file(meta_path, "[1]", false);
  EXPECT_EQ(io::checkpoint_problem(path, net.named_parameters(), nullptr, ""), "meta.json is not a JSON object");
  io::write_file(meta_path, original, false);
  EXPECT_EQ(io::checkpoint_problem(path, net.named_parameters(), nullptr, ""), "");
  EXPECT_EQ(io::read_checkpoint_meta(path).step, 6);
  fs::remove(meta_path);
  EXPECT_EQ(io::checkpoint_problem(path, net.named_parameters(), nullptr, ""), "meta.json is missing");
  EXPECT_CPF_ERROR(io::read_checkpoint_meta(path), "checkpoint " + path + ": meta.json is missing");
  EXPECT_EQ(io::checkpoint_problem(dir() + "/nowhere", net.named_parameters(), nullptr, ""), "not a folder");
}

TEST_F(Checkpoint, ListingIgnoresOtherNamesAndMissingFolders) {
  EXPECT_TRUE(io::list_checkpoints(dir()).empty());
  EXPECT_FALSE(io::find_latest_valid(dir(), {}, nullptr, "").has_value());
  fs::create_directories(dir_ / "step_12");
  fs::create_directories(dir_ / "step_0000000x");
  fs::create_directories(dir_ / "best");
  fs::create_directories(dir_ / "step_000000010");
  fs::create_directories(dir_ / "step_00000002");
  io::write_file((dir_ / "step_00000003").string(), "a file, not a folder", false);
  EXPECT_EQ(io::list_checkpoints(dir()), (std::vector<std::string>{step_dir(2), (dir_ / "step_000000010").string()}));
  EXPECT_EQ(io::checkpoint_dir_name(123456789), "step_123456789");
}

TEST_F(Checkpoint, SaveRejectsBadArguments) {
  Net net;
  EXPECT_CPF_ERROR(io::save_checkpoint("", net.named_parameters(), nullptr, meta_at(1)),
                   "save_checkpoint: the folder name is empty");
  EXPECT_CPF_ERROR(io::save_checkpoint(dir(), net.named_parameters(), nullptr, meta_at(1), -1),
                   "save_checkpoint: keep_last must be >= 0 (0 keeps all), got -1");
  EXPECT_CPF_ERROR(io::save_checkpoint(dir(), {}, nullptr, meta_at(1)), "save_checkpoint: the model has no parameters");
  EXPECT_CPF_ERROR(io::save_checkpoint(dir(), net.named_parameters(), nullptr, meta_at(-1)),
                   "checkpoint: step must be >= 0, got -1");
  optim::NamedTensors twice = net.named_parameters();
  twice.push_back(twice[0]);
  EXPECT_CPF_ERROR(io::save_checkpoint(dir(), twice, nullptr, meta_at(1)),
                   "tensor name 'fc1.weight' appears more than once");
  EXPECT_TRUE(io::list_checkpoints(dir()).empty()) << "a failed save leaves no checkpoint";
  EXPECT_EQ(names(), std::vector<std::string>{}) << "and no temporary folder";
  io::write_file((dir_ / "file").string(), "x", false);
  EXPECT_CPF_ERROR(io::save_checkpoint((dir_ / "file" / "sub").string(), net.named_parameters(), nullptr, meta_at(1)),
                   "save_checkpoint: cannot create " + (dir_ / "file" / "sub").string());
  fs::remove(dir_ / "file");
}

}  // namespace
}  // namespace cpf
