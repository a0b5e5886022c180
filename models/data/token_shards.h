#pragma once
// Token shards in llm.c's `.bin` layouts (dev/data/data_common.py in karpathy/llm.c):
//
//   bytes 0..1023       256 x int32 little-endian header: [0] magic, [1] version, [2] token count N,
//                       the rest 0
//   bytes 1024..        N token ids, little-endian
//
//   GPT-2 layout     magic 20240520, version 1, uint16 ids: 1024 + 2 N bytes (vocabularies <= 65536)
//   Llama 3 layout   magic 20240801, version 7, uint32 ids: 1024 + 4 N bytes
//
// Each shard names its own layout, so a pattern may mix them; shard_writer.h writes both.
//
// `path` is a file or a pattern ("data/*_train_*.bin", models/data/file_glob.h); shards are read in
// sorted order with positioned reads (pread), a document at a time, so a corpus larger than RAM works,
// and a shard truncated while it is read gives an error naming it (a memory mapping would die of SIGBUS instead); each
// shard keeps one file descriptor open. Documents are the maximal runs of tokens between end-of-text tokens (50256 for
// GPT-2, `eot_token`); a document never spans two shards. Every token is checked against vocab_size
// when the shard is opened.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "models/data/deprecated_namespace.h"
#include "models/data/document_source.h"
#include "models/data/tokenizer.h"

namespace cpf::models::data {

constexpr int32_t kShardMagic = 20240520;  // uint16 tokens
constexpr int32_t kShardVersion = 1;
constexpr int32_t kShardMagicU32 = 20240801;  // uint32 tokens (llm.c's Llama 3 shards)
constexpr int32_t kShardVersionU32 = 7;
constexpr int64_t kShardHeaderInts = 256;
constexpr int64_t kShardHeaderBytes = kShardHeaderInts * 4;

// The largest vocabulary a shard can hold: uint32 ids, capped where int32 token counts and ids meet.
constexpr int64_t kMaxShardVocabSize = int64_t{1} << 31;

struct ShardOptions {
  std::string path;
  int64_t eot_token = 50256;
  int64_t vocab_size = 50257;                  // in [1, 2^31]; uint16 shards hold ids below 65536 whatever it says
  std::shared_ptr<const Tokenizer> tokenizer;  // decodes samples; null: ids print as "<id>"
};

// The header of one shard, validated against the file size (errors name the file and the values).
struct ShardHeader {
  int64_t token_count = 0;
  int64_t token_bytes = 2;  // 2 (uint16, version 1) or 4 (uint32, version 7)
};
ShardHeader read_shard_header(const std::string& path);

class TokenShardSource : public DocumentSource {
 public:
  explicit TokenShardSource(const ShardOptions& options);
  ~TokenShardSource() override;
  TokenShardSource(const TokenShardSource&) = delete;
  TokenShardSource& operator=(const TokenShardSource&) = delete;

  const std::vector<std::string>& files() const { return files_; }
  int64_t total_tokens() const { return total_tokens_; }

  std::string name() const override { return "shards"; }
  int64_t num_documents() const override { return static_cast<int64_t>(documents_.size()); }
  int64_t document_length(int64_t index) const override;
  Document document(int64_t index) const override;
  int64_t vocab_size() const override { return options_.vocab_size; }
  int64_t eot_token() const override { return options_.eot_token; }
  // Text through the tokenizer; without one, ids print as "<id>" (end-of-text as "<|endoftext|>").
  std::string decode(const std::vector<int64_t>& tokens) const override;

 private:
  struct OpenShard;
  struct DocumentSpan {
    int64_t shard;
    int64_t begin;  // token index inside the shard
    int64_t length;
  };

  ShardOptions options_;
  std::vector<std::string> files_;
  std::vector<std::unique_ptr<OpenShard>> shards_;
  std::vector<DocumentSpan> documents_;
  int64_t total_tokens_ = 0;
};

}  // namespace cpf::models::data
