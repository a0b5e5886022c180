// `cpformer tokenize`, `cpformer train-tokenizer`, data.tokenizer and generate with a run's tokenizer,
// end to end through the CLI: exit codes and messages of every refusal, and text that comes back.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "models/data/token_shards.h"
#include "tests/apps/cli_support.h"

namespace cpf::trainer {
namespace {
namespace fs = std::filesystem;

using testing::run;
using testing::scratch_dir;
using testing::write_file;

std::string corpus() {
  std::string text;
  for (int i = 0; i < 60; ++i) {
    text += "The cat number " + std::to_string(i) + " sat on the mat.\nIt was a good mat.\n\n";
  }
  return text;
}

// A small model config on `source` data; `data` holds the source-specific keys.
void write_config(const fs::path& path, const fs::path& run_dir, const std::string& data) {
  write_file(path, "run:\n  out_dir: " + run_dir.string() +
                       "\n  steps: 2\n  threads: 1\nmodel:\n  hidden_size: 16\n  num_layers: 1\n  num_heads: 2\n"
                       "data:\n" +
                       data + "  seq_len: 16\n  batch_size: 4\n");
}

TEST(TokenizeCli, Gpt2ShardsTrainAndGenerateText) {
  const auto dir = scratch_dir("t");
  write_file(dir / "a.txt", corpus());
  const auto t =
      run({"tokenize", (dir / "a.txt").string(), "--output", (dir / "cats").string(), "--val-documents", "5"});
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_NE(t.out.find("tokenize: 60 documents from 1 file(s)"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("(gpt2, uint16) in "), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("tokens/s"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("  val   " + (dir / "cats").string() + "_val_000000.bin"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("  train " + (dir / "cats").string() + "_train_000000.bin"), std::string::npos) << t.out;
  EXPECT_EQ(models::data::read_shard_header((dir / "cats_train_000000.bin").string()).token_bytes, 2);

  write_config(dir / "c.yaml", dir / "run", "  source: shards\n  path: " + (dir / "cats_train_*.bin").string() + "\n");
  const auto train = run({"train", (dir / "c.yaml").string()});
  ASSERT_EQ(train.code, 0) << train.err;
  const auto g = run({"generate", (dir / "run").string(), "--prompt", "The cat", "--tokens", "3"});
  ASSERT_EQ(g.code, 0) << g.err;
  EXPECT_EQ(g.out.rfind("The cat", 0), 0u) << "the prompt comes back as text: " << g.out;
  EXPECT_EQ(g.out.find("<"), std::string::npos) << "ids decode to text, not <id>: " << g.out;
}

TEST(TokenizeCli, TerminalProgressBarEndsAtFullWithThroughput) {
  const auto dir = scratch_dir("t");
  write_file(dir / "a.txt", corpus());
  std::ostringstream out, err;
  const int code = run_cli({"tokenize", (dir / "a.txt").string(), "--output", (dir / "p").string()}, out, err, true);
  ASSERT_EQ(code, 0) << err.str();
  const std::string text = out.str();
  const size_t bar = text.find("\r[########################] tokenize: ");
  ASSERT_NE(bar, std::string::npos) << text;
  EXPECT_NE(text.find("MB (100%) | 60 docs | ", bar), std::string::npos) << text;
  EXPECT_NE(text.find("M tokens | ", bar), std::string::npos) << text;
  EXPECT_NE(text.find(" MB/s, ", bar), std::string::npos) << text;
  EXPECT_NE(text.find("M tokens/s\ntokenize: 60 documents", bar), std::string::npos) << text;
}

TEST(TokenizeCli, SentencePieceRoundTripThroughTheRunFolder) {
  const auto dir = scratch_dir("t");
  write_file(dir / "a.txt", corpus());
  const auto tt =
      run({"train-tokenizer", (dir / "a.txt").string(), "--output", (dir / "sp").string(), "--vocab-size", "300"});
  ASSERT_EQ(tt.code, 0) << tt.err;
  EXPECT_NE(tt.out.find("train-tokenizer: wrote " + (dir / "sp.model").string() + " (300 pieces, bpe, end-of-text 2)"),
            std::string::npos)
      << tt.out;
  const std::string model = (dir / "sp.model").string();
  const auto t =
      run({"tokenize", (dir / "a.txt").string(), "--output", (dir / "sp_docs").string(), "--tokenizer", model});
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_NE(t.out.find("data.tokenizer: " + model + ", data.eot_token: 2, data.vocab_size: 300"), std::string::npos)
      << t.out;
  write_config(dir / "c.yaml", dir / "run",
               "  source: shards\n  path: " + (dir / "sp_docs_train_*.bin").string() + "\n  tokenizer: " + model +
                   "\n  eot_token: 2\n  vocab_size: 300\n");
  const auto train = run({"train", (dir / "c.yaml").string()});
  ASSERT_EQ(train.code, 0) << train.err;
  EXPECT_TRUE(fs::exists(dir / "run" / "tokenizer.model")) << "the run records its tokenizer";
  fs::remove(model);  // generate uses the run's copy
  const auto g = run({"generate", (dir / "run").string(), "--prompt", "The cat sat", "--tokens", "3"});
  ASSERT_EQ(g.code, 0) << g.err;
  EXPECT_EQ(g.out.rfind("The cat sat", 0), 0u) << g.out;
}

TEST(TokenizeCli, TextWithGpt2TokenizerTrainsAndGenerates) {
  const auto dir = scratch_dir("t");
  write_file(dir / "a.txt", corpus());
  write_config(dir / "c.yaml", dir / "run",
               "  source: text\n  path: " + (dir / "a.txt").string() + "\n  tokenizer: gpt2\n");
  const auto train = run({"train", (dir / "c.yaml").string()});
  ASSERT_EQ(train.code, 0) << train.err;
  EXPECT_TRUE(fs::exists(dir / "run" / "config.yaml"));
  EXPECT_NE(testing::read_file(dir / "run" / "config.yaml").find("tokenizer: gpt2"), std::string::npos);
  const auto g = run({"generate", (dir / "run").string(), "--prompt", "<|endoftext|>It was", "--tokens", "2"});
  ASSERT_EQ(g.code, 0) << g.err;
  EXPECT_EQ(g.out.rfind("<|endoftext|>It was", 0), 0u) << g.out;
}

TEST(TokenizeCli, Uint32ShardsForLargeVocabularies) {
  // A byte-level BPE tokenizer.json whose end-of-text id is 70000: its ids need uint32 shards.
  const auto dir = scratch_dir("t");
  std::string vocab;
  for (int b = 33; b <= 126; ++b) {
    if (b == '"' || b == '\\') continue;
    vocab += (vocab.empty() ? "\"" : ",\"") + std::string(1, static_cast<char>(b)) + "\":" + std::to_string(b);
  }
  // The other bytes in GPT-2's printable alphabet: U+0100 + k for the 68 non-printable bytes, etc.
  const char* rest[] = {"\\\"", "\\\\"};
  vocab += std::string(",\"") + rest[0] + "\":34,\"" + rest[1] + "\":92";
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(next++);
    if (b >= 33 && b <= 126) continue;
    char utf8[4] = {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F)), 0, 0};
    vocab += ",\"" + std::string(utf8, 2) + "\":" + std::to_string(b);
  }
  write_file(dir / "big.json",
             R"({"added_tokens":[{"id":70000,"content":"<|endoftext|>","special":true}],)"
             R"("normalizer":null,"pre_tokenizer":{"type":"ByteLevel"},"model":{"type":"BPE","vocab":{)" +
                 vocab + R"(},"merges":[]}})");
  write_file(dir / "a.txt", "hello world\n\nsecond document\n");
  const auto narrow = run({"tokenize", (dir / "a.txt").string(), "--output", (dir / "x").string(), "--tokenizer",
                           (dir / "big.json").string(), "--token-type", "uint16"});
  EXPECT_EQ(narrow.code, 2);
  EXPECT_NE(narrow.err.find("tokenizer " + (dir / "big.json").string() +
                            " has 70001 tokens, more than uint16 ids hold; "
                            "use uint32"),
            std::string::npos)
      << narrow.err;
  const auto wide = run({"tokenize", (dir / "a.txt").string(), "--output", (dir / "x").string(), "--tokenizer",
                         (dir / "big.json").string()});
  ASSERT_EQ(wide.code, 0) << wide.err;
  EXPECT_NE(wide.out.find(", uint32) in "), std::string::npos) << wide.out;
  const auto header = models::data::read_shard_header((dir / "x_train_000000.bin").string());
  EXPECT_EQ(header.token_bytes, 4);
  EXPECT_EQ(header.token_count, 2 + 11 + 15);  // eot + bytes of each document
  // ... and `source: shards` trains on them.
  write_config(dir / "c.yaml", dir / "run",
               "  source: shards\n  path: " + (dir / "x_train_*.bin").string() +
                   "\n  tokenizer: " + (dir / "big.json").string() + "\n  eot_token: 70000\n  vocab_size: 70001\n");
  const auto train = run({"train", (dir / "c.yaml").string()});
  EXPECT_EQ(train.code, 0) << train.err;
}

TEST(TokenizeCli, RefusalsAndTheirExitCodes) {
  const auto dir = scratch_dir("t");
  write_file(dir / "a.txt", "some text\n");
  const std::string in = (dir / "a.txt").string(), out = (dir / "o").string();
  const auto expect = [](const testing::CliResult& r, int code, const std::string& message) {
    EXPECT_EQ(r.code, code) << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << "stderr: " << r.err << "\nexpected: " << message;
  };
  expect(run({"tokenize", "--output", out}), 2, "'tokenize' needs at least one input text file");
  expect(run({"tokenize", in}), 2, "'tokenize' needs --output PREFIX");
  expect(run({"tokenize", in, "--output", (dir / "no" / "o").string()}), 2,
         "the folder '" + (dir / "no").string() + "' does not exist");
  expect(run({"tokenize", in, "--output", out, "--tokenizer", "gpt3"}), 2,
         "--tokenizer gpt3: tokenizer 'gpt3' is not a known name or a tokenizer file");
  expect(run({"tokenize", in, "--output", out, "--token-type", "int8"}), 2,
         "token type 'int8' is not uint16 or uint32");
  expect(run({"tokenize", in, "--output", out, "--text-split", "para"}), 2, "unknown text_split 'para'");
  expect(run({"tokenize", in, "--output", out, "--text-split", "separator"}), 2,
         "--text-split separator needs --text-separator S");
  expect(run({"tokenize", in, "--output", out, "--shard-tokens", "0"}), 2,
         "--shard-tokens 0: expected 1 to 2147483647");
  expect(run({"tokenize", in, "--output", out, "--val-documents", "-1"}), 2, "--val-documents -1: expected 0 or more");
  expect(run({"tokenize", (dir / "missing_*.txt").string(), "--output", out}), 3, "missing_*.txt");
  expect(run({"tokenize", in, "--output", out, "--val-documents", "1"}), 1,
         "the inputs hold 1 documents and --val-documents takes 1, leaving none to train on");
  expect(run({"train-tokenizer", in, "--output", out}), 2, "'train-tokenizer' needs --vocab-size N");
  expect(run({"train-tokenizer", in, "--vocab-size", "100"}), 2, "'train-tokenizer' needs --output PREFIX");
  expect(run({"train-tokenizer", in, "--output", out, "--vocab-size", "8"}), 2, "--vocab-size 8: expected at least 16");
  expect(run({"train-tokenizer", in, "--output", out, "--vocab-size", "100", "--model-type", "word"}), 2,
         "--model-type word: expected bpe or unigram");
  expect(run({"train-tokenizer", (dir / "none.txt").string(), "--output", out, "--vocab-size", "100"}), 3, "none.txt");
}

TEST(TokenizeCli, ConfigAndGenerateRefusals) {
  const auto dir = scratch_dir("t");
  write_file(dir / "a.txt", corpus());
  write_config(
      dir / "c.yaml", dir / "run",
      "  source: text\n  path: " + (dir / "a.txt").string() + "\n  tokenizer: " + (dir / "no.json").string() + "\n");
  const auto missing = run({"train", (dir / "c.yaml").string()});
  EXPECT_EQ(missing.code, 2);
  EXPECT_NE(missing.err.find("data.tokenizer=" + (dir / "no.json").string() + " tokenizer file '" +
                             (dir / "no.json").string() + "' does not exist"),
            std::string::npos)
      << missing.err;
  // Shards whose end-of-text is not GPT-2's and no data.tokenizer: training works, generate cannot speak.
  ASSERT_EQ(run({"tokenize", (dir / "a.txt").string(), "--output", (dir / "b").string(), "--tokenizer", "bytes"}).code,
            0);
  write_config(
      dir / "s.yaml", dir / "srun",
      "  source: shards\n  path: " + (dir / "b_train_*.bin").string() + "\n  eot_token: 256\n  vocab_size: 257\n");
  ASSERT_EQ(run({"train", (dir / "s.yaml").string()}).code, 0);
  const auto g = run({"generate", (dir / "srun").string(), "--prompt", "The"});
  EXPECT_EQ(g.code, 1);
  EXPECT_NE(g.err.find("was trained on token shards with eot_token=256 and no data.tokenizer"), std::string::npos)
      << g.err;
  // data.tokenizer that disagrees with the shards is a config error naming the fix.
  write_config(dir / "m.yaml", dir / "mrun",
               "  source: shards\n  path: " + (dir / "b_train_*.bin").string() +
                   "\n  eot_token: 256\n  vocab_size: 257\n  tokenizer: gpt2\n");
  const auto mismatch = run({"train", (dir / "m.yaml").string()});
  EXPECT_EQ(mismatch.code, 2);
  EXPECT_NE(mismatch.err.find("ends documents with id 50256 but eot_token=256; set data.eot_token: 50256"),
            std::string::npos)
      << mismatch.err;
}

}  // namespace
}  // namespace cpf::trainer
