// load_checkpoint_pieces (framework/io/sharded_checkpoint.h): a rank of a sharded run fills only its own
// pieces of the weights and of the optimizer state, from a sharded checkpoint of another world size or a
// one-file checkpoint, reading only the stored entries that overlap them (a corrupted entry elsewhere is
// never read); gaps, unknown tensors, misshapen pieces, another config and a missing optimizer state are
// refused by name, with nothing live changed.
#include <gtest/gtest.h>

#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <map>

#include "framework/io/sharded_checkpoint.h"
#include "framework/optim/adamw.h"
#include "framework/tensor/ops/copy.h"
#include "tests/io/checkpoint_test_net.h"

namespace cpf {
namespace {

namespace fs = std::filesystem;
using testing::Net;
using testing::pieces_of;
using testing::snapshot;
using testing::train_step;

// Zeros in the shapes and names of `pieces`: what a resuming rank holds before the load.
optim::NamedTensors zeros_like_all(const optim::NamedTensors& pieces) {
  optim::NamedTensors out;
  for (const auto& [name, t] : pieces) out.emplace_back(name, zeros_like(t).set_requires_grad(true));
  return out;
}

// Name -> values (the optimizer lists its state by parameter group, not by name).
std::map<std::string, std::vector<float>> by_name(const optim::NamedTensors& tensors) {
  std::map<std::string, std::vector<float>> out;
  for (const auto& [name, t] : tensors) out[name] = t.to_vector<float>();
  return out;
}

class CheckpointRanges : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("cpf_ranges_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    train_step(net_, opt_);
    train_step(net_, opt_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string save_sharded(int64_t world) {
    const std::string tmp = io::prepare_sharded_checkpoint(dir_.string(), 2);
    const optim::NamedTensors state = opt_.state_tensors();
    for (int64_t r = 0; r < world; ++r) {
      const optim::NamedTensors s = pieces_of(state, r, world);
      io::write_checkpoint_shard(tmp, r, world, pieces_of(net_.named_parameters(), r, world), &s);
    }
    return io::finish_sharded_checkpoint(dir_.string(), tmp, meta(), world);
  }
  std::string save_whole() { return io::save_checkpoint(dir_.string(), net_.named_parameters(), &opt_, meta()); }
  io::CheckpointMeta meta() const {
    io::CheckpointMeta m{.step = 2, .config_hash = "cfg"};
    m.optimizer_name = opt_.name();
    m.optimizer_step = opt_.step_count();
    return m;
  }

  Net net_{4, 1};
  optim::AdamW opt_{net_.named_parameters(), {.lr = 0.01}};
  fs::path dir_;
};

TEST_F(CheckpointRanges, EveryLayoutFillsThisRanksPiecesAndTheirState) {
  for (const int64_t saved_world : {0, 1, 3}) {  // 0: the one-file checkpoint of a replicated run
    fs::remove_all(dir_);
    const std::string path = saved_world == 0 ? save_whole() : save_sharded(saved_world);
    for (int64_t rank = 0; rank < 2; ++rank) {
      const optim::NamedTensors expected = pieces_of(net_.named_parameters(), rank, 2);
      const optim::NamedTensors mine = zeros_like_all(expected);
      optim::AdamW piece_opt(mine, {.lr = 0.01});
      const io::CheckpointMeta m = io::load_checkpoint_pieces(path, mine, &piece_opt, "cfg");
      EXPECT_EQ(m.step, 2);
      EXPECT_EQ(snapshot(mine), snapshot(expected)) << "saved by " << saved_world << ", rank " << rank;
      EXPECT_EQ(by_name(piece_opt.state_tensors()), by_name(pieces_of(opt_.state_tensors(), rank, 2)));
      EXPECT_EQ(piece_opt.step_count(), opt_.step_count());
    }
  }
}

// Rank 2's file has a flipped byte: a rank whose pieces lie in ranks 0 and 1's files never reads it and
// loads; one whose pieces overlap it fails on the checksum, naming the file.
TEST_F(CheckpointRanges, ReadsOnlyTheStoredPiecesThatOverlap) {
  const std::string path = save_sharded(3);
  const fs::path bad = fs::path(path) / "model.shard-00002-of-00003.safetensors";
  {
    std::fstream f(bad, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-1, std::ios::end);
    const char c = static_cast<char>(f.get() ^ 0x40);
    f.seekp(-1, std::ios::end);
    f.put(c);
  }
  const optim::NamedTensors first = zeros_like_all(pieces_of(net_.named_parameters(), 0, 3));
  io::load_checkpoint_pieces(path, first, nullptr, "cfg");
  EXPECT_EQ(snapshot(first), snapshot(pieces_of(net_.named_parameters(), 0, 3)));
  const optim::NamedTensors last = zeros_like_all(pieces_of(net_.named_parameters(), 1, 2));
  EXPECT_CPF_ERROR(io::load_checkpoint_pieces(path, last, nullptr, "cfg"),
                   "model.shard-00002-of-00003.safetensors: tensor");
  EXPECT_CPF_ERROR(io::load_checkpoint_pieces(path, last, nullptr, "cfg"), "fails its checksum");
  for (const auto& [name, t] : last) EXPECT_EQ(t.to_vector<float>(), std::vector<float>(t.numel(), 0.0f)) << name;
}

TEST_F(CheckpointRanges, RefusesWhatItCannotFillWithNothingChanged) {
  const std::string path = save_sharded(2);
  const auto load = [&](const std::string& name, int64_t numel, const std::string& hash = "cfg") {
    const optim::NamedTensors one = {{name, zeros({numel})}};
    io::load_checkpoint_pieces(path, one, nullptr, hash);
  };
  EXPECT_CPF_ERROR(load("fc1.bias[2:6]", 4), "elements [4, 6) of 'fc1.bias' are in no file (the model wants them)");
  EXPECT_CPF_ERROR(load("fc9.bias[0:2]", 2), "the checkpoint holds no tensor 'fc9.bias' which the model has");
  EXPECT_CPF_ERROR(load("fc1.bias[0:3]", 2), "the model's 'fc1.bias[0:3]' of shape [2] is not a piece");
  EXPECT_CPF_ERROR(load("fc1.bias[0:2]", 2, "other"), "config hash 'cfg' differs from the expected 'other'");
  fs::remove(fs::path(path) / "model.shard-00001-of-00002.safetensors");
  const optim::NamedTensors both = {{"fc1.bias[0:2]", full({2}, 7.0)}, {"fc1.bias[2:4]", full({2}, 7.0)}};
  EXPECT_CPF_ERROR(io::load_checkpoint_pieces(path, both, nullptr, "cfg"),
                   "model.shard-00001-of-00002.safetensors is missing");
  for (const auto& [name, t] : both) EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{7, 7})) << name;

  fs::remove_all(dir_);
  const std::string weights_only = io::save_checkpoint(dir_.string(), net_.named_parameters(), nullptr, meta());
  const optim::NamedTensors mine = zeros_like_all(pieces_of(net_.named_parameters(), 0, 2));
  optim::AdamW piece_opt(mine, {.lr = 0.01});
  EXPECT_CPF_ERROR(io::load_checkpoint_pieces(weights_only, mine, &piece_opt, "cfg"),
                   "the checkpoint holds no optimizer state (weights only)");
}

}  // namespace
}  // namespace cpf
