// text_to_shards (the library half of `cpformer tokenize`): documents cut as `source: text` cuts them,
// the validation split, file order, progress figures, and the refusals.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "models/data/gpt2_tokenizer.h"
#include "models/data/text_to_shards.h"
#include "models/data/token_shards.h"
#include "support/test_utils.h"

namespace cpf::models::data {
namespace {
namespace fs = std::filesystem;

class TextToShardsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("cpf_text_to_shards_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    std::ofstream((dir_ / name).string(), std::ios::binary) << text;
    return (dir_ / name).string();
  }
  std::vector<std::vector<int64_t>> documents(const std::string& pattern) {
    const TokenShardSource source({.path = pattern});
    std::vector<std::vector<int64_t>> docs;
    for (int64_t i = 0; i < source.num_documents(); ++i) docs.push_back(source.document(i).tokens);
    return docs;
  }
  fs::path dir_;
};

TEST_F(TextToShardsTest, DocumentsSplitOrderAndProgress) {
  write("b.txt", "third one\n\nfourth one\n");
  write("a.txt", "first one\n\n\nsecond one\n");
  const auto gpt2 = gpt2_tokenizer();
  std::vector<TextToShardsProgress> seen;
  const TextToShardsResult r = text_to_shards({.inputs = {(dir_ / "*.txt").string()},
                                               .tokenizer = gpt2,
                                               .output_prefix = (dir_ / "out").string(),
                                               .val_documents = 1},
                                              [&](const TextToShardsProgress& p) { seen.push_back(p); });
  EXPECT_EQ(r.input_files, (std::vector<std::string>{(dir_ / "a.txt").string(), (dir_ / "b.txt").string()}));
  EXPECT_EQ(r.documents, 4);
  EXPECT_EQ(r.val_documents, 1);
  EXPECT_EQ(r.type, ShardTokenType::uint16);
  EXPECT_EQ(documents((dir_ / "out_val_*.bin").string()),
            (std::vector<std::vector<int64_t>>{gpt2->encode("first one")}));
  EXPECT_EQ(documents((dir_ / "out_train_*.bin").string()),
            (std::vector<std::vector<int64_t>>{gpt2->encode("second one"), gpt2->encode("third one"),
                                               gpt2->encode("fourth one")}));
  EXPECT_EQ(r.val_tokens, 1 + 2);
  EXPECT_EQ(r.train_tokens, 3 * (1 + 2));
  ASSERT_FALSE(seen.empty());
  for (size_t i = 1; i < seen.size(); ++i) EXPECT_GE(seen[i].bytes_done, seen[i - 1].bytes_done);
  EXPECT_EQ(seen.back().bytes_done, seen.back().bytes_total);
  EXPECT_EQ(seen.back().bytes_total, r.bytes);
  EXPECT_EQ(seen.back().documents, 4);
  EXPECT_EQ(seen.back().tokens, r.train_tokens + r.val_tokens);
}

TEST_F(TextToShardsTest, SeparatorSplitAndBytesTokenizer) {
  const std::string file = write("s.txt", "ab@@cd");
  const TextToShardsResult r = text_to_shards({.inputs = {file},
                                               .split = TextSplit::separator,
                                               .separator = "@@",
                                               .tokenizer = load_tokenizer("bytes"),
                                               .output_prefix = (dir_ / "s").string()});
  EXPECT_EQ(r.documents, 2);
  const TokenShardSource source({.path = (dir_ / "s_train_*.bin").string(), .eot_token = 256, .vocab_size = 257});
  EXPECT_EQ(source.document(0).tokens, (std::vector<int64_t>{'a', 'b'}));
  EXPECT_EQ(source.document(1).tokens, (std::vector<int64_t>{'c', 'd'}));
}

TEST_F(TextToShardsTest, Refusals) {
  const std::string file = write("x.txt", "one\n");
  const auto gpt2 = gpt2_tokenizer();
  const std::string out = (dir_ / "x").string();
  EXPECT_CPF_ERROR(text_to_shards({.inputs = {}, .tokenizer = gpt2, .output_prefix = out}), "no input text files");
  EXPECT_CPF_ERROR(text_to_shards({.inputs = {file}, .tokenizer = nullptr, .output_prefix = out}), "no tokenizer");
  EXPECT_CPF_ERROR(
      text_to_shards({.inputs = {(dir_ / "none_*.txt").string()}, .tokenizer = gpt2, .output_prefix = out}),
      "matches no file");
  EXPECT_CPF_ERROR(text_to_shards({.inputs = {file}, .tokenizer = gpt2, .output_prefix = out, .val_documents = 1}),
                   "the inputs hold 1 documents and --val-documents takes 1, leaving none to train on");
  EXPECT_FALSE(fs::exists(out + "_train_000000.bin")) << "nothing half-written is left as a shard";
  EXPECT_CPF_ERROR(
      text_to_shards({.inputs = {file}, .split = TextSplit::separator, .tokenizer = gpt2, .output_prefix = out}),
      "text split 'separator' needs a separator string");
}

}  // namespace
}  // namespace cpf::models::data
