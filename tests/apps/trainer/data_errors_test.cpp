// Unreadable data ends `cpformer train` with exit code 3 and one clear message, never a crash.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "apps/trainer/trainer.h"
#include "tests/apps/cli_support.h"

namespace cpf::trainer {
namespace {

using testing::run;
using testing::scratch_dir;
using testing::write_file;

// An llm.c shard header (magic, version, count) followed by `tokens`, written with plain fwrite.
void write_shard(const std::filesystem::path& path, int32_t magic, int32_t declared_count,
                 const std::vector<uint16_t>& tokens) {
  std::vector<int32_t> header(256, 0);
  header[0] = magic;
  header[1] = 1;
  header[2] = declared_count;
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  std::fwrite(header.data(), 4, header.size(), f);
  std::fwrite(tokens.data(), 2, tokens.size(), f);
  std::fclose(f);
}

std::vector<uint16_t> some_tokens(int n) {
  std::vector<uint16_t> t;
  for (int i = 0; i < n; ++i) t.push_back(static_cast<uint16_t>(i % 7 == 6 ? 50256 : i % 300));
  return t;
}

// Trains on `source` data at `path`; returns the CLI result.
testing::CliResult train_on(const std::filesystem::path& dir, const std::string& source, const std::string& path,
                            const std::string& extra = "") {
  write_file(dir / "c.yaml", "run:\n  out_dir: " + (dir / "run").string() + "\n  steps: 2\n  threads: 1\n" + extra +
                                 "model:\n  hidden_size: 16\n  num_layers: 1\n  num_heads: 2\n"
                                 "data:\n  source: " +
                                 source + "\n  path: " + path + "\n  seq_len: 16\n  batch_size: 4\n");
  return run({"train", (dir / "c.yaml").string()});
}

void expect_data_error(const testing::CliResult& r, const std::string& message) {
  EXPECT_EQ(r.code, 3) << r.out << r.err;
  EXPECT_NE(r.err.find("cpformer: data error: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(message), std::string::npos) << "stderr: " << r.err << "\nexpected: " << message;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

// DataError is a cpf::Error like every other error, its text the message alone; the CLI catches it
// before Error (exit code 3, the tests below).
TEST(DataErrors, DataErrorIsACpfErrorWhoseTextIsTheMessage) {
  try {
    throw DataError("data.path 'x.bin': no such file");
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "data.path 'x.bin': no such file");
    EXPECT_EQ(e.message(), e.what());
  }
}

TEST(DataErrors, TruncatedShard) {
  const auto dir = scratch_dir("d");
  write_shard(dir / "train_000.bin", 20240520, 100, some_tokens(60));
  expect_data_error(
      train_on(dir, "shards", (dir / "train_*.bin").string()),
      "train_000.bin': the header says 100 tokens, i.e. 1224 bytes, but the file has 1144 bytes (truncated)");
}

TEST(DataErrors, WrongMagicShard) {
  const auto dir = scratch_dir("d");
  write_shard(dir / "train_000.bin", 12345, 100, some_tokens(100));
  expect_data_error(train_on(dir, "shards", (dir / "train_000.bin").string()),
                    "train_000.bin': magic number 12345 is not 20240520 (not an llm.c token shard)");
}

TEST(DataErrors, FileShorterThanTheShardHeader) {
  const auto dir = scratch_dir("d");
  write_file(dir / "train_000.bin", "not a shard");
  expect_data_error(train_on(dir, "shards", (dir / "train_000.bin").string()),
                    "the file has 11 bytes, fewer than the 1024-byte header");
}

TEST(DataErrors, EmptyTextFile) {
  const auto dir = scratch_dir("d");
  write_file(dir / "empty.txt", "");
  expect_data_error(train_on(dir, "text", (dir / "empty.txt").string()), "empty.txt' is empty");
}

TEST(DataErrors, MissingFilesAndBadHeldOutData) {
  const auto dir = scratch_dir("d");
  expect_data_error(train_on(dir, "text", (dir / "nothing_*.txt").string()), "nothing_*.txt");
  write_file(dir / "train.txt", "some text\n\nmore text\n");
  write_file(dir / "held_out.txt", "");
  expect_data_error(
      train_on(dir, "text", (dir / "train.txt").string(), "  eval_path: " + (dir / "held_out.txt").string() + "\n"),
      "run.eval_path: text source: file '");
}

TEST(DataErrors, GoodShardsTrain) {
  // The same writer with a correct header: the run succeeds, so the errors above are about the data.
  const auto dir = scratch_dir("d");
  write_shard(dir / "train_000.bin", 20240520, 700, some_tokens(700));
  const auto r = train_on(dir, "shards", (dir / "train_000.bin").string());
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("no held-out data (set run.eval_path)"), std::string::npos) << r.out;
  // GPT-2 shards (eot 50256) decode with the built-in gpt2 tokenizer: generate continues the prompt.
  const auto g = run({"generate", (dir / "run").string(), "--prompt", "hi", "--tokens", "2"});
  EXPECT_EQ(g.code, 0) << g.err;
  EXPECT_EQ(g.out.rfind("hi", 0), 0u) << g.out;
}

}  // namespace
}  // namespace cpf::trainer
