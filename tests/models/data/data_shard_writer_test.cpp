// Shards written by ShardWriter in both llm.c layouts: their bytes checked with plain fread (no
// library reader), then read back through TokenShardSource.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "models/data/shard_writer.h"
#include "models/data/token_shards.h"
#include "support/test_utils.h"

namespace cpf::models::data {
namespace {
namespace fs = std::filesystem;

struct RawShard {
  std::vector<int32_t> header;
  std::vector<int64_t> tokens;
  int64_t file_bytes = 0;
};

// The file as llm.c's readers see it: 256 int32, then uint16 or uint32 ids as the magic says.
RawShard read_raw(const std::string& path, int token_bytes) {
  RawShard raw;
  raw.file_bytes = static_cast<int64_t>(fs::file_size(path));
  FILE* f = std::fopen(path.c_str(), "rb");
  EXPECT_NE(f, nullptr);
  raw.header.resize(256);
  EXPECT_EQ(std::fread(raw.header.data(), 4, 256, f), 256u);
  for (int32_t i = 0; i < raw.header[2]; ++i) {
    uint32_t v = 0;
    EXPECT_EQ(std::fread(&v, static_cast<size_t>(token_bytes), 1, f), 1u);
    raw.tokens.push_back(v);
  }
  std::fclose(f);
  return raw;
}

std::vector<std::vector<int64_t>> all_documents(const TokenShardSource& source) {
  std::vector<std::vector<int64_t>> docs;
  for (int64_t i = 0; i < source.num_documents(); ++i) docs.push_back(source.document(i).tokens);
  return docs;
}

class ShardWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("cpf_shard_writer_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string prefix(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

TEST_F(ShardWriterTest, Uint16ShardsAreLlmcVersion1) {
  ShardWriter writer({.prefix = prefix("tiny_train"), .shard_tokens = 1000, .eot_token = 50256});
  writer.add_document({15496, 11, 995});
  writer.add_document({65535});
  const auto files = writer.finish();
  ASSERT_EQ(files, (std::vector<std::string>{prefix("tiny_train") + "_000000.bin"}));
  const RawShard raw = read_raw(files[0], 2);
  EXPECT_EQ(raw.header[0], 20240520);
  EXPECT_EQ(raw.header[1], 1);
  EXPECT_EQ(raw.header[2], 6);
  EXPECT_EQ(std::count(raw.header.begin() + 3, raw.header.end(), 0), 253);
  EXPECT_EQ(raw.file_bytes, 1024 + 2 * 6);
  EXPECT_EQ(raw.tokens, (std::vector<int64_t>{50256, 15496, 11, 995, 50256, 65535}));
  const TokenShardSource source({.path = files[0], .eot_token = 50256, .vocab_size = 65536});
  EXPECT_EQ(all_documents(source), (std::vector<std::vector<int64_t>>{{15496, 11, 995}, {65535}}));
  EXPECT_EQ(writer.tokens_written(), 6);
}

TEST_F(ShardWriterTest, Uint32ShardsAreLlmcLlama3Layout) {
  ShardWriter writer({.prefix = prefix("llama"), .type = ShardTokenType::uint32, .eot_token = 128000});
  writer.add_document({9906, 128255, 70000});
  writer.add_document({1});
  const auto files = writer.finish();
  ASSERT_EQ(files.size(), 1u);
  const RawShard raw = read_raw(files[0], 4);
  EXPECT_EQ(raw.header[0], 20240801);
  EXPECT_EQ(raw.header[1], 7);
  EXPECT_EQ(raw.header[2], 6);
  EXPECT_EQ(raw.file_bytes, 1024 + 4 * 6);
  EXPECT_EQ(raw.tokens, (std::vector<int64_t>{128000, 9906, 128255, 70000, 128000, 1}));
  const TokenShardSource source({.path = files[0], .eot_token = 128000, .vocab_size = 128256});
  EXPECT_EQ(all_documents(source), (std::vector<std::vector<int64_t>>{{9906, 128255, 70000}, {1}}));
  EXPECT_EQ(source.total_tokens(), 6);
  // Every id is still checked against vocab_size.
  EXPECT_CPF_ERROR(TokenShardSource({.path = files[0], .eot_token = 128000, .vocab_size = 128255}),
                   "token 128255 at index 2 is not below vocab_size=128255");
}

TEST_F(ShardWriterTest, ShardsFillExactlyAndDocumentsContinue) {
  ShardWriter writer({.prefix = prefix("s"), .shard_tokens = 5, .eot_token = 0});
  writer.add_document({1, 2, 3});
  writer.add_document({4, 5, 6, 7});
  const auto files = writer.finish();
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(read_raw(files[0], 2).tokens, (std::vector<int64_t>{0, 1, 2, 3, 0}));
  EXPECT_EQ(read_raw(files[1], 2).tokens, (std::vector<int64_t>{4, 5, 6, 7}));
  const TokenShardSource source({.path = prefix("s") + "_*.bin", .eot_token = 0, .vocab_size = 8});
  EXPECT_EQ(all_documents(source), (std::vector<std::vector<int64_t>>{{1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_FALSE(fs::exists(files[1] + ".tmp"));
}

TEST_F(ShardWriterTest, MixedLayoutsReadThroughOnePattern) {
  ShardWriter narrow({.prefix = prefix("a"), .eot_token = 9});
  narrow.add_document({1, 2});
  narrow.finish();
  ShardWriter wide({.prefix = prefix("b"), .type = ShardTokenType::uint32, .eot_token = 9});
  wide.add_document({3});
  wide.finish();
  const TokenShardSource source({.path = (dir_ / "*_000000.bin").string(), .eot_token = 9, .vocab_size = 10});
  EXPECT_EQ(all_documents(source), (std::vector<std::vector<int64_t>>{{1, 2}, {3}}));
}

TEST_F(ShardWriterTest, Uint32HeaderErrors) {
  ShardWriter writer({.prefix = prefix("w"), .type = ShardTokenType::uint32, .eot_token = 0});
  writer.add_document({1, 2});
  const std::string file = writer.finish()[0];
  // Version 1 with the uint32 magic: the layouts are not mixed within a file.
  {
    FILE* f = std::fopen(file.c_str(), "r+b");
    const int32_t version = 1;
    std::fseek(f, 4, SEEK_SET);
    std::fwrite(&version, 4, 1, f);
    std::fclose(f);
  }
  EXPECT_CPF_ERROR(TokenShardSource({.path = file, .eot_token = 0, .vocab_size = 3}),
                   "version 1 is not supported with magic 20240801 (expected 7: uint32 tokens)");
  fs::resize_file(file, 1024 + 4 * 3 - 2);
  {
    FILE* f = std::fopen(file.c_str(), "r+b");
    const int32_t version = 7;
    std::fseek(f, 4, SEEK_SET);
    std::fwrite(&version, 4, 1, f);
    std::fclose(f);
  }
  EXPECT_CPF_ERROR(TokenShardSource({.path = file, .eot_token = 0, .vocab_size = 3}),
                   "the header says 3 tokens, i.e. 1036 bytes, but the file has 1034 bytes (truncated)");
}

TEST_F(ShardWriterTest, RejectsIdsAndOptionsThatDoNotFit) {
  ShardWriter writer({.prefix = prefix("x"), .eot_token = 0});
  EXPECT_CPF_ERROR(writer.add_document({70000}),
                   "token id 70000 does not fit uint16 shards (ids below 65536); write uint32 shards");
  EXPECT_CPF_ERROR(writer.add_document({-1}), "token id -1 does not fit");
  EXPECT_CPF_ERROR(ShardWriter({.prefix = prefix("y"), .shard_tokens = 0}), "shard_tokens=0 must lie in [1, 2^31 - 1]");
  EXPECT_CPF_ERROR(ShardWriter({.prefix = prefix("y"), .eot_token = 65536}), "end-of-text id 65536 does not fit");
  EXPECT_CPF_ERROR(ShardWriter({.prefix = (dir_ / "missing" / "z").string()}),
                   "the output folder '" + (dir_ / "missing").string() + "' does not exist; create it first");
  EXPECT_CPF_ERROR(parse_shard_token_type("int8"), "token type 'int8' is not uint16 or uint32");
  EXPECT_EQ(shard_token_type_for(65536), ShardTokenType::uint16);
  EXPECT_EQ(shard_token_type_for(65537), ShardTokenType::uint32);
}

TEST_F(ShardWriterTest, AnUnfinishedShardLeavesNoFile) {
  {
    ShardWriter writer({.prefix = prefix("u"), .eot_token = 0});
    writer.add_document({1, 2, 3});
  }  // destroyed without finish(): as when an exception stops `cpformer tokenize`
  EXPECT_TRUE(fs::is_empty(dir_));
}

}  // namespace
}  // namespace cpf::models::data
