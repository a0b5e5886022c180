// Sharded checkpoints (framework/io/sharded_checkpoint.h): ranks write their pieces in any order, rank 0
// publishes, and load_checkpoint assembles the whole model and optimizer state; pieces that leave a gap
// or overlap, a missing rank, a missing or corrupted shard file, bad piece names and non-finite values
// are refused with messages naming them.
#include "framework/io/sharded_checkpoint.h"

#include <gtest/gtest.h>

#include <unistd.h>
#include <filesystem>
#include <fstream>

#include "framework/io/file_io.h"
#include "framework/optim/adamw.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/views.h"
#include "tests/io/checkpoint_test_net.h"

namespace cpf {
namespace {

namespace fs = std::filesystem;
using testing::Net;
using testing::pieces_of;
using testing::snapshot;
using testing::train_step;

class ShardedCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("cpf_sharded_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    train_step(net_, opt_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes step `step` from `world` ranks (in the order given), each with pieces_of(.., overlap).
  std::string save(int64_t step, int64_t world, const std::vector<int64_t>& order, int64_t overlap = 0) {
    const std::string tmp = io::prepare_sharded_checkpoint(dir_.string(), step);
    const optim::NamedTensors state = opt_.state_tensors();
    for (int64_t r : order) {
      const optim::NamedTensors s = pieces_of(state, r, world, overlap);
      io::write_checkpoint_shard(tmp, r, world, pieces_of(net_.named_parameters(), r, world, overlap), &s);
    }
    io::CheckpointMeta meta{.step = step, .config_hash = "cfg"};
    meta.optimizer_name = opt_.name();
    meta.optimizer_step = opt_.step_count();
    return io::finish_sharded_checkpoint(dir_.string(), tmp, meta, world);
  }

  Net net_{4, 1};
  optim::AdamW opt_{net_.named_parameters(), {.lr = 0.01}};
  fs::path dir_;
};

TEST_F(ShardedCheckpoint, RanksWriteTheirPiecesAndAnyWorldLoadsTheWhole) {
  const std::string path = save(3, 3, {2, 0, 1});
  EXPECT_EQ(testing::sorted_names(path),
            (std::vector<std::string>{
                "meta.json", "model.shard-00000-of-00003.safetensors", "model.shard-00001-of-00003.safetensors",
                "model.shard-00002-of-00003.safetensors", "optimizer.shard-00000-of-00003.safetensors",
                "optimizer.shard-00001-of-00003.safetensors", "optimizer.shard-00002-of-00003.safetensors"}));
  EXPECT_EQ(io::read_checkpoint_meta(path).step, 3);
  Net fresh(4, 99);
  optim::AdamW fresh_opt(fresh.named_parameters(), {.lr = 0.01});
  EXPECT_EQ(io::checkpoint_problem(path, fresh.named_parameters(), &fresh_opt, "cfg", io::CheckDepth::data), "");
  EXPECT_EQ(io::find_latest_valid(dir_.string(), fresh.named_parameters(), &fresh_opt, "cfg"), path);
  const io::CheckpointMeta meta = io::load_checkpoint(path, fresh.named_parameters(), &fresh_opt, "cfg");
  EXPECT_EQ(meta.optimizer_step, 1);
  EXPECT_EQ(snapshot(fresh.named_parameters()), snapshot(net_.named_parameters()));
  EXPECT_EQ(snapshot(fresh_opt.state_tensors()), snapshot(opt_.state_tensors()));
  // Weights only (generate, export): the optimizer's files are not needed.
  Net weights(4, 98);
  io::load_checkpoint(path, weights.named_parameters(), nullptr, "");
  EXPECT_EQ(snapshot(weights.named_parameters()), snapshot(net_.named_parameters()));
}

TEST_F(ShardedCheckpoint, GapsOverlapsAndDamagedFilesAreRefusedByName) {
  const auto problem = [&](const std::string& path) {
    Net fresh(4, 5);
    optim::AdamW fresh_opt(fresh.named_parameters(), {.lr = 0.01});
    return io::checkpoint_problem(path, fresh.named_parameters(), &fresh_opt, "cfg", io::CheckDepth::data);
  };
  // fc1.weight has 12 elements: 4 per rank; rank 1 (elements 4 to 8) has not written yet.
  const std::string tmp = io::prepare_sharded_checkpoint(dir_.string(), 1);
  const optim::NamedTensors state = opt_.state_tensors();
  for (int64_t r : {0, 2}) {
    const optim::NamedTensors s = pieces_of(state, r, 3);
    io::write_checkpoint_shard(tmp, r, 3, pieces_of(net_.named_parameters(), r, 3), &s);
  }
  io::CheckpointMeta meta{.step = 1, .config_hash = "cfg"};
  meta.optimizer_name = opt_.name();
  EXPECT_CPF_ERROR(io::finish_sharded_checkpoint(dir_.string(), tmp, meta, 3),
                   "finish_sharded_checkpoint: rank 1 of 3 left no receipt");
  // All receipts, but rank 1 left fc1.weight out: a gap.
  const optim::NamedTensors s1 = pieces_of(state, 1, 3);
  optim::NamedTensors p1 = pieces_of(net_.named_parameters(), 1, 3);
  p1.erase(p1.begin());  // fc1.weight[4:8]
  io::write_checkpoint_shard(tmp, 1, 3, p1, &s1);
  EXPECT_EQ(problem(io::finish_sharded_checkpoint(dir_.string(), tmp, meta, 3)),
            "elements [4, 8) of 'fc1.weight' are in no file (the model has 12)");
  // Ranks that overlap by one element.
  EXPECT_NE(problem(save(2, 3, {0, 1, 2}, 1))
                .find("elements [3, 4) of 'fc1.weight' are in both "
                      "model.shard-00000-of-00003.safetensors and "
                      "model.shard-00001-of-00003.safetensors"),
            std::string::npos);
  const std::string good = save(4, 3, {0, 1, 2});
  const fs::path shard = fs::path(good) / "model.shard-00001-of-00003.safetensors";
  std::string bytes = io::read_file(shard.string());
  bytes[bytes.size() - 2] = static_cast<char>(bytes[bytes.size() - 2] ^ 0x40);
  io::write_file(shard.string(), bytes, false);
  EXPECT_NE(problem(good).find("model.shard-00001-of-00003.safetensors: tensor '"), std::string::npos) << problem(good);
  EXPECT_NE(problem(good).find("fails its checksum"), std::string::npos);
  fs::remove(fs::path(good) / "optimizer.shard-00002-of-00003.safetensors");
  EXPECT_EQ(problem(good), "optimizer.shard-00002-of-00003.safetensors is missing");
}

TEST_F(ShardedCheckpoint, PieceNamesAndValuesAreCheckedBeforeWriting) {
  EXPECT_EQ(io::parse_piece_name("blocks.0.w[4:12]"),
            std::make_optional(std::make_pair(std::string("blocks.0.w"), std::make_pair(int64_t{4}, int64_t{12}))));
  for (const char* bad : {"w", "w[4]", "w[4:4]", "w[5:4]", "[0:3]", "w[-1:3]", "w[0:3]x"}) {
    EXPECT_FALSE(io::parse_piece_name(bad).has_value()) << bad;
  }
  const std::string tmp = io::prepare_sharded_checkpoint(dir_.string(), 7);
  EXPECT_CPF_ERROR(io::write_checkpoint_shard(tmp, 0, 1, {{"fc1.weight", zeros({3})}}, nullptr),
                   "write_checkpoint_shard: parameter piece 'fc1.weight' of shape [3] is not a piece");
  EXPECT_CPF_ERROR(io::write_checkpoint_shard(tmp, 0, 1, {{"fc1.weight[0:2]", zeros({3})}}, nullptr),
                   "is not a piece (a 1-D tensor named <tensor>[begin:end] with end - begin elements)");
  Tensor bad = zeros({2});
  raw::fill_(raw::narrow(bad, 0, 1, 1), std::nan(""));
  EXPECT_CPF_ERROR(io::write_checkpoint_shard(tmp, 0, 1, {{"fc1.weight[0:2]", bad}}, nullptr),
                   "write_checkpoint_shard: refusing to write rank 0's pieces into");
  EXPECT_CPF_ERROR(io::write_checkpoint_shard(tmp, 1, 1, {}, nullptr), "write_checkpoint_shard: rank 1 of world 1");
  EXPECT_TRUE(testing::sorted_names(tmp).empty()) << "nothing written by refused calls";
  EXPECT_CPF_ERROR(io::prepare_sharded_checkpoint("", 7), "prepare_sharded_checkpoint: the folder name is empty");
  EXPECT_CPF_ERROR(io::write_checkpoint_shard((dir_ / "nowhere").string(), 0, 1, {}, nullptr),
                   "is not a folder (rank 0 prepares it with prepare_sharded_checkpoint before the ranks write)");
  EXPECT_CPF_ERROR(io::finish_sharded_checkpoint(dir_.string(), tmp, io::CheckpointMeta{.step = 8}, 1),
                   "is not the temporary folder of step 8 (prepare_sharded_checkpoint's)");
  EXPECT_CPF_ERROR(io::finish_sharded_checkpoint(dir_.string(), tmp, io::CheckpointMeta{.step = 7}, 0),
                   "finish_sharded_checkpoint: world 0 must be at least 1");
}

}  // namespace
}  // namespace cpf
