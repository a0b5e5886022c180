#include <gtest/gtest.h>

#include <unistd.h>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>

#include "models/data/data_loader.h"
#include "models/data/token_shards.h"
#include "support/test_utils.h"

namespace cpf::models::data {
namespace {
namespace fs = std::filesystem;

// Writes a shard the way llm.c's data_common.py does, with no library code: 256 int32 then uint16 tokens.
// `count_in_header` lets a test lie about the token count.
void write_shard(const std::string& path, const std::vector<uint16_t>& tokens, int32_t magic = 20240520,
                 int32_t version = 1, int64_t count_in_header = -1) {
  int32_t header[256] = {};
  header[0] = magic;
  header[1] = version;
  header[2] = static_cast<int32_t>(count_in_header >= 0 ? count_in_header : static_cast<int64_t>(tokens.size()));
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(std::fwrite(header, sizeof(int32_t), 256, f), 256u);
  if (!tokens.empty()) ASSERT_EQ(std::fwrite(tokens.data(), sizeof(uint16_t), tokens.size(), f), tokens.size());
  std::fclose(f);
}

class TokenShardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("cpf_shards_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

constexpr uint16_t kEot = 50256;

std::vector<std::vector<int64_t>> all_documents(const TokenShardSource& source) {
  std::vector<std::vector<int64_t>> docs;
  for (int64_t i = 0; i < source.num_documents(); ++i) {
    docs.push_back(source.document(i).tokens);
    EXPECT_EQ(source.document_length(i), static_cast<int64_t>(docs.back().size()));
    EXPECT_EQ(source.document(i).prompt_length, 0);
  }
  return docs;
}

TEST_F(TokenShardTest, ReadsDocumentsSplitOnEndOfText) {
  write_shard(path("train_000.bin"), {kEot, 10, 11, 12, kEot, 20, kEot, kEot, 30, 31});
  const TokenShardSource source({.path = path("train_000.bin")});
  EXPECT_EQ(source.total_tokens(), 10);
  EXPECT_EQ(all_documents(source), (std::vector<std::vector<int64_t>>{{10, 11, 12}, {20}, {30, 31}}));
  EXPECT_EQ(source.vocab_size(), 50257);
  EXPECT_EQ(source.eot_token(), 50256);
  EXPECT_EQ(source.decode({5, kEot}), "<5><|endoftext|>");
}

TEST_F(TokenShardTest, PatternsReadShardsInOrderAndDocumentsStopAtShardEnds) {
  write_shard(path("train_001.bin"), {kEot, 7, 8});
  write_shard(path("train_000.bin"), {kEot, 1, 2, kEot, 3});
  write_shard(path("val_000.bin"), {kEot, 99});
  const TokenShardSource source({.path = path("train_*.bin")});
  EXPECT_EQ(source.files(), (std::vector<std::string>{path("train_000.bin"), path("train_001.bin")}));
  EXPECT_EQ(all_documents(source), (std::vector<std::vector<int64_t>>{{1, 2}, {3}, {7, 8}}));
}

TEST_F(TokenShardTest, ConfigurableEndOfTextAndVocabulary) {
  write_shard(path("small.bin"), {1, 2, 0, 3, 0, 4, 5});
  const TokenShardSource source({.path = path("small.bin"), .eot_token = 0, .vocab_size = 6});
  EXPECT_EQ(all_documents(source), (std::vector<std::vector<int64_t>>{{1, 2}, {3}, {4, 5}}));
  write_shard(path("big.bin"), {65535, 2});
  const TokenShardSource full_range({.path = path("big.bin"), .eot_token = 2, .vocab_size = 65536});
  EXPECT_EQ(all_documents(full_range), (std::vector<std::vector<int64_t>>{{65535}}));
}

TEST_F(TokenShardTest, HeaderErrorsNameTheFileAndTheValues) {
  const std::string magic = path("magic.bin");
  write_shard(magic, {1, 2}, 12345);
  EXPECT_CPF_ERROR(TokenShardSource({.path = magic}),
                   "token shard '" + magic +
                       "': magic number 12345 is not 20240520 (not an llm.c token shard); uint32 "
                       "shards have 20240801");
  const std::string version = path("version.bin");
  write_shard(version, {1, 2}, 20240520, 2);
  EXPECT_CPF_ERROR(TokenShardSource({.path = version}), "token shard '" + version + "': version 2 is not supported");
  const std::string truncated = path("truncated.bin");
  write_shard(truncated, {1, 2, 3}, 20240520, 1, 5);
  EXPECT_CPF_ERROR(TokenShardSource({.path = truncated}),
                   "token shard '" + truncated +
                       "': the header says 5 tokens, i.e. 1034 bytes, but the file has 1030 "
                       "bytes (truncated)");
  const std::string trailing = path("trailing.bin");
  write_shard(trailing, {1, 2, 3}, 20240520, 1, 2);
  EXPECT_CPF_ERROR(TokenShardSource({.path = trailing}), "but the file has 1030 bytes (trailing data)");
  const std::string negative = path("negative.bin");
  write_shard(negative, {}, 20240520, 1, 0x80000000LL);
  EXPECT_CPF_ERROR(TokenShardSource({.path = negative}), "negative token count -2147483648");
  const std::string tiny = path("tiny.bin");
  FILE* f = std::fopen(tiny.c_str(), "wb");
  std::fputs("short", f);
  std::fclose(f);
  EXPECT_CPF_ERROR(TokenShardSource({.path = tiny}),
                   "token shard '" + tiny + "': the file has 5 bytes, fewer than the 1024");
  EXPECT_CPF_ERROR(read_shard_header(path("absent.bin")), "token shard '" + path("absent.bin") + "' does not exist");
}

TEST_F(TokenShardTest, ContentErrors) {
  const std::string big = path("big.bin");
  write_shard(big, {kEot, 1, 50257});
  EXPECT_CPF_ERROR(TokenShardSource({.path = big}),
                   "token shard '" + big + "': token 50257 at index 2 is not below vocab_size=50257");
  const std::string only_eot = path("only_eot.bin");
  write_shard(only_eot, {kEot, kEot});
  EXPECT_CPF_ERROR(TokenShardSource({.path = only_eot}), "the 1 shard(s) hold no document (2 tokens");
  const std::string empty = path("empty.bin");
  write_shard(empty, {});
  EXPECT_CPF_ERROR(TokenShardSource({.path = empty}), "hold no document (0 tokens");
}

// Documents of 99 tokens and an end-of-text each: 1000 documents, 200 KB of tokens (many pages).
std::vector<uint16_t> many_documents() {
  std::vector<uint16_t> tokens;
  for (int d = 0; d < 1000; ++d) {
    for (int t = 0; t < 99; ++t) tokens.push_back(static_cast<uint16_t>(1 + (d + t) % 1000));
    tokens.push_back(kEot);
  }
  return tokens;
}

// A shard cut short after it was opened gives an error naming it (memory-mapped, the read of a lost
// page killed the process with SIGBUS).
TEST_F(TokenShardTest, AShardTruncatedAfterOpeningIsAnErrorNamingIt) {
  const std::string file = path("train_000.bin");
  write_shard(file, many_documents());
  const TokenShardSource source({.path = file});
  ASSERT_EQ(source.num_documents(), 1000);
  fs::resize_file(file, 1024 + 2 * 100 * 10);  // ten documents remain
  EXPECT_EQ(source.document(9).tokens.size(), 99u);
  EXPECT_CPF_ERROR(source.document(999),
                   "token shard '" + file +
                       "': cannot read tokens [99900, 99999) of the 100000 its header announced (" + file +
                       ": unexpected end of file at byte 200824 (198 more bytes expected)); the file "
                       "shrank while in use (truncated or rewritten)");
  // Opening it again reports the truncation from the header.
  EXPECT_CPF_ERROR(TokenShardSource({.path = file}),
                   "the header says 100000 tokens, i.e. 201024 bytes, but the file "
                   "has 3024 bytes (truncated)");
}

// The same while a loader is reading batches from it on another thread.
TEST_F(TokenShardTest, ALoaderReadingAShardThatShrinksStopsWithAnErrorNamingIt) {
  const std::string file = path("train_000.bin");
  write_shard(file, many_documents());
  DataOptions options;
  options.source = "shards";
  options.path = file;
  options.seq_len = 64;
  options.batch_size = 4;
  DataLoader loader(options);
  std::atomic<int64_t> batches{0};
  std::string error;
  std::atomic<bool> finished{false};
  std::thread reader([&] {
    try {
      // Two epochs hold 4000 batches: after the truncation some document is out of reach long before.
      for (int i = 0; i < 4000; ++i) {
        loader.next();
        ++batches;
      }
    } catch (const Error& e) {
      error = e.what();
    }
    finished = true;
  });
  while (batches < 5 && !finished) std::this_thread::yield();
  fs::resize_file(file, 1024 + 2 * 100 * 10);
  reader.join();
  EXPECT_NE(error.find("token shard '" + file + "': cannot read tokens ["), std::string::npos) << error;
  EXPECT_NE(error.find("the file shrank while in use (truncated or rewritten)"), std::string::npos) << error;
}

TEST_F(TokenShardTest, PathAndOptionErrors) {
  EXPECT_CPF_ERROR(TokenShardSource({.path = path("missing.bin")}),
                   "token shards: file '" + path("missing.bin") + "' does not exist");
  EXPECT_CPF_ERROR(TokenShardSource({.path = path("*.bin")}),
                   "token shards: pattern '" + path("*.bin") + "' matches no file");
  write_shard(path("ok.bin"), {1, 2});
  EXPECT_CPF_ERROR(TokenShardSource({.path = path("ok.bin"), .eot_token = 50257}),
                   "eot_token=50257 is outside [0, vocab_size=50257)");
  EXPECT_CPF_ERROR(TokenShardSource({.path = path("ok.bin"), .vocab_size = (int64_t{1} << 31) + 1}),
                   "vocab_size=2147483649 must lie in [1, 2^31]");
  const TokenShardSource source({.path = path("ok.bin")});
  EXPECT_CPF_ERROR(source.document(-1), "shards: document index -1 is outside [0, 1)");
}

}  // namespace
}  // namespace cpf::models::data
