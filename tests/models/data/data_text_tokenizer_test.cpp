// data.tokenizer: text encoded with a tokenizer, the defaults of effective_tokenizer(), and shards
// whose tokenizer must agree with their eot_token and vocab_size.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include "models/data/data_options.h"
#include "models/data/gpt2_tokenizer.h"
#include "models/data/shard_writer.h"
#include "models/data/text_source.h"
#include "models/data/token_shards.h"
#include "support/test_utils.h"

namespace cpf::models::data {
namespace {
namespace fs = std::filesystem;

class TextTokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("cpf_text_tok_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    std::ofstream((dir_ / name).string(), std::ios::binary) << text;
    return (dir_ / name).string();
  }
  fs::path dir_;
};

TEST_F(TextTokenizerTest, Gpt2TextDocumentsAreItsIds) {
  const std::string file = write("a.txt", "Hello world!\nIt's here.\n\n  \nSecond <|endoftext|> doc\n");
  DataOptions o;
  o.source = "text";
  o.path = file;
  o.tokenizer = "gpt2";
  EXPECT_EQ(effective_tokenizer(o), "gpt2");
  EXPECT_EQ(data_source_vocab_size(o), 50257);
  const auto source = make_document_source(o);
  EXPECT_EQ(source->vocab_size(), 50257);
  EXPECT_EQ(source->eot_token(), 50256);
  ASSERT_EQ(source->num_documents(), 2);
  const auto gpt2 = gpt2_tokenizer();
  EXPECT_EQ(source->document(0).tokens, gpt2->encode("Hello world!\nIt's here."));
  const auto second = source->document(1).tokens;
  EXPECT_EQ(second, gpt2->encode("Second <|endoftext|> doc"));
  EXPECT_EQ(std::count(second.begin(), second.end(), 50256), 0) << "a literal <|endoftext|> in a file stays text";
  EXPECT_EQ(source->document_length(1), static_cast<int64_t>(second.size()));
  EXPECT_EQ(source->decode(second), "Second <|endoftext|> doc");
  EXPECT_EQ(source->decode({15496, 50256}), "Hello<|endoftext|>");
}

TEST_F(TextTokenizerTest, BytesStayTheDefault) {
  DataOptions o;
  o.source = "text";
  o.path = write("b.txt", "ab");
  EXPECT_EQ(effective_tokenizer(o), "bytes");
  EXPECT_EQ(data_source_vocab_size(o), 257);
  EXPECT_EQ(make_document_source(o)->document(0).tokens, (std::vector<int64_t>{97, 98}));
  o.tokenizer = "bytes";
  EXPECT_EQ(make_document_source(o)->vocab_size(), 257);
}

TEST_F(TextTokenizerTest, ShardDefaultsAndAgreement) {
  DataOptions o;
  o.source = "shards";
  o.path = (dir_ / "s_*.bin").string();
  EXPECT_EQ(effective_tokenizer(o), "gpt2") << "llm.c's GPT-2 shards";
  o.eot_token = 0;
  o.vocab_size = 100;
  EXPECT_EQ(effective_tokenizer(o), "") << "other shards have no tokenizer unless one is named";
  EXPECT_EQ(data_source_vocab_size(o), 100);
  o.tokenizer = "gpt2";
  EXPECT_CPF_ERROR(data_source_vocab_size(o),
                   "data: tokenizer gpt2 ends documents with id 50256 but eot_token=0; set data.eot_token: 50256");
  o.eot_token = 50256;
  o.vocab_size = 50000 + 257 - 1;
  EXPECT_CPF_ERROR(data_source_vocab_size(o),
                   "data: tokenizer gpt2 has 50257 tokens, more than vocab_size=50256; set data.vocab_size: 50257");
  o.vocab_size = 50304;  // llm.c pads GPT-2's vocabulary
  EXPECT_EQ(data_source_vocab_size(o), 50304);
  // Samples of shards decode through their tokenizer.
  ShardWriter writer({.prefix = (dir_ / "s").string(), .eot_token = 50256});
  writer.add_document(gpt2_tokenizer()->encode("Hello, world"));
  writer.finish();
  const auto source = make_document_source(o);
  EXPECT_EQ(source->decode(source->document(0).tokens), "Hello, world");
}

TEST_F(TextTokenizerTest, AMissingTokenizerFileIsNamed) {
  DataOptions o;
  o.source = "text";
  o.path = write("c.txt", "x");
  o.tokenizer = (dir_ / "nope.json").string();
  EXPECT_CPF_ERROR(data_source_vocab_size(o), "tokenizer file '" + o.tokenizer + "' does not exist");
  o.tokenizer = "gpt-2";
  EXPECT_CPF_ERROR(make_document_source(o), "tokenizer 'gpt-2' is not a known name or a tokenizer file");
}

}  // namespace
}  // namespace cpf::models::data
