#pragma once
// Writes token shards in llm.c's layouts (token_shards.h), as its dev/data scripts do: every document
// is written as end-of-text followed by its tokens, shards are filled to `shard_tokens` exactly (a
// document that does not fit continues in the next shard; the reader treats the two parts as two
// documents), and the last shard holds the rest.
//
// Files are <prefix>_000000.bin, <prefix>_000001.bin, ... Each is written as <file>.tmp and renamed
// when complete, so a crash or a full disk never leaves a file that looks like a valid shard; errors
// name the file and the OS error.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>
#include "models/data/deprecated_namespace.h"

namespace cpf::models::data {

enum class ShardTokenType { uint16, uint32 };

// uint16 when every id fits (vocab_size <= 65536), else uint32.
ShardTokenType shard_token_type_for(int64_t vocab_size);
// "uint16" | "uint32"; throws listing the names.
ShardTokenType parse_shard_token_type(const std::string& name);

struct ShardWriterOptions {
  std::string prefix;                  // "data/tiny_train" -> data/tiny_train_000000.bin
  int64_t shard_tokens = 100'000'000;  // tokens per shard (llm.c's fineweb default), at most 2^31 - 1
  ShardTokenType type = ShardTokenType::uint16;
  int64_t eot_token = 50256;
};

class ShardWriter {
 public:
  // Throws when the options are invalid or the folder of `prefix` does not exist.
  explicit ShardWriter(const ShardWriterOptions& options);
  ~ShardWriter();  // an unfinished shard's .tmp is removed
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Appends end-of-text and `tokens`; throws when an id does not fit the token type.
  void add_document(const std::vector<int64_t>& tokens);
  // Completes the last shard and returns every file written. Nothing is written for no document.
  std::vector<std::string> finish();

  int64_t tokens_written() const { return total_tokens_; }

 private:
  void append(int64_t token);
  void open_shard();
  void close_shard();
  void write_bytes(const void* data, size_t size);

  ShardWriterOptions options_;
  std::FILE* file_ = nullptr;
  std::string path_;      // the shard being written (its .tmp while open)
  int64_t in_shard_ = 0;  // tokens in the open shard
  int64_t total_tokens_ = 0;
  std::vector<unsigned char> buffer_;
  std::vector<std::string> files_;
};

}  // namespace cpf::models::data
