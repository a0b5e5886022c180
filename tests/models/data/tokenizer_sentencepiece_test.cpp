// SentencePiece models through libsentencepiece: training one from text files, loading it, and the
// special tokens, round trips and refusals around it.
#include <gtest/gtest.h>
#include <sentencepiece_trainer.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "framework/core/error.h"
#include "models/data/sentencepiece_tokenizer.h"

namespace cpf::models::data {
namespace {
namespace fs = std::filesystem;

class SentencePieceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("cpf_sp_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    // Two files of pseudo-English, one sentence a line.
    std::mt19937 rng(3);
    const char* words[] = {"the", "cat",   "sat",  "on",   "a",       "mat",        "and",   "dog",
                           "ran", "to",    "hill", "over", "quickly", "tokenizers", "learn", "pieces",
                           "of",  "words", "from", "text", "1984",    "42"};
    for (const char* name : {"a.txt", "b.txt"}) {
      std::ofstream out(dir_ / name);
      for (int line = 0; line < 400; ++line) {
        for (int w = 0; w < 8; ++w) out << (w ? " " : "") << words[rng() % std::size(words)];
        out << ".\n";
      }
      inputs_.push_back((dir_ / name).string());
    }
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string train(int64_t vocab) {
    return train_sentencepiece({.inputs = inputs_, .model_prefix = (dir_ / "sp").string(), .vocab_size = vocab});
  }
  fs::path dir_;
  std::vector<std::string> inputs_;
};

TEST_F(SentencePieceTest, TrainsLoadsAndRoundTrips) {
  const std::string model = train(320);
  EXPECT_EQ(model, (dir_ / "sp.model").string());
  const auto tok = load_tokenizer(model);
  EXPECT_EQ(tok->vocab_size(), 320);
  EXPECT_EQ(tok->eot_token(), 2);
  EXPECT_EQ(tok->name(), model);
  // Byte fallback and identity normalization: anything round-trips, unseen characters included.
  for (const std::string text : {"the cat sat on the mat.", "  two  spaces\tand a tab",
                                 "\xe6\x97\xa5\xe6\x9c\xac 1984!", "tokenizers learn pieces"}) {
    const auto ids = tok->encode(text);
    for (int64_t id : ids) EXPECT_TRUE(id >= 3 && id < 320) << "no control id in ordinary text: " << id;
    EXPECT_EQ(tok->decode(ids), text);
  }
  // Learned pieces: a frequent word is shorter in tokens than in bytes.
  EXPECT_LT(tok->encode("tokenizers").size(), std::string("tokenizers").size());
  // Control pieces are the special tokens: "</s>" in a prompt is the end-of-text id.
  const auto parsed = tok->encode("the cat</s>", SpecialTokens::parse);
  EXPECT_EQ(parsed.back(), 2);
  EXPECT_EQ(tok->decode(parsed), "the cat</s>");
  // Ids outside the vocabulary (a padded model vocabulary can sample them) print as <id>.
  const std::vector<int64_t> cat = tok->encode("the cat");
  std::vector<int64_t> with_unknown = cat;
  with_unknown.push_back(999);
  EXPECT_EQ(tok->decode(with_unknown), "the cat<999>");
}

TEST_F(SentencePieceTest, RefusesBadTrainingRequests) {
  const auto message = [&](SentencePieceTraining o) {
    try {
      train_sentencepiece(o);
    } catch (const Error& e) {
      return e.message();
    }
    return std::string("no error");
  };
  const std::string prefix = (dir_ / "m").string();
  EXPECT_NE(message({.inputs = {}, .model_prefix = prefix}).find("no input text files"), std::string::npos);
  EXPECT_NE(message({.inputs = {"/nonexistent.txt"}, .model_prefix = prefix})
                .find("input file '/nonexistent.txt' does not exist"),
            std::string::npos);
  EXPECT_NE(message({.inputs = inputs_, .model_prefix = prefix, .vocab_size = 8}).find("vocab size 8 must lie in"),
            std::string::npos);
  EXPECT_NE(message({.inputs = inputs_, .model_prefix = prefix, .model_type = "word"}).find("model type 'word'"),
            std::string::npos);
  // More pieces than the text can make: SentencePiece's own message comes through.
  EXPECT_NE(message({.inputs = inputs_, .model_prefix = prefix, .vocab_size = 100000}).find("could not train"),
            std::string::npos);
}

TEST_F(SentencePieceTest, RefusesFilesThatAreNotUsableModels) {
  const auto message = [&](const std::string& path) {
    try {
      load_tokenizer(path);
    } catch (const Error& e) {
      return e.message();
    }
    return std::string("no error");
  };
  const std::string junk = (dir_ / "junk.model").string();
  std::ofstream(junk) << "not a protobuf";
  EXPECT_NE(message(junk).find("is not a SentencePiece model"), std::string::npos) << message(junk);
  // A model trained without an end-of-sentence piece cannot end documents.
  const std::string prefix = (dir_ / "noeos").string();
  const auto status = sentencepiece::SentencePieceTrainer::Train(
      {{"input", inputs_[0]}, {"model_prefix", prefix}, {"vocab_size", "60"}, {"model_type", "bpe"}, {"eos_id", "-1"}});
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_NE(message(prefix + ".model").find("has no end-of-sentence piece (eos_id = -1)"), std::string::npos)
      << message(prefix + ".model");
}

}  // namespace
}  // namespace cpf::models::data
