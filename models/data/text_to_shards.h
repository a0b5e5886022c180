#pragma once
// Text files -> llm.c token shards, the library half of `cpformer tokenize`: files are cut into
// documents as `source: text` cuts them (text_source.h), each document is encoded as plain text with
// the tokenizer and written end-of-text first (shard_writer.h). With val_documents = N the first N
// documents go to <prefix>_val_000000.bin..., the rest to <prefix>_train_000000.bin...; files are read
// one at a time, in the sorted order of each pattern, inputs in the order given.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "models/data/deprecated_namespace.h"
#include "models/data/shard_writer.h"
#include "models/data/text_source.h"
#include "models/data/tokenizer.h"

namespace cpf::models::data {

struct TextToShardsOptions {
  std::vector<std::string> inputs;  // files or patterns (file_glob.h)
  TextSplit split = TextSplit::blank_lines;
  std::string separator;
  std::shared_ptr<const Tokenizer> tokenizer;
  std::string output_prefix;
  int64_t val_documents = 0;
  int64_t shard_tokens = 100'000'000;
  std::optional<ShardTokenType> type;  // default: uint16 when the vocabulary fits, else uint32
};

struct TextToShardsProgress {
  int64_t bytes_done = 0, bytes_total = 0;
  int64_t documents = 0, tokens = 0;
};

struct TextToShardsResult {
  std::vector<std::string> input_files;
  std::vector<std::string> train_files, val_files;
  int64_t documents = 0, val_documents = 0;
  int64_t train_tokens = 0, val_tokens = 0;  // end-of-text tokens included
  int64_t bytes = 0;
  ShardTokenType type = ShardTokenType::uint16;
};

// Validates everything (inputs exist, prefix folder, token type fits the vocabulary) before writing;
// `progress` is called after every document. Throws cpf::Error naming the file or option at fault.
TextToShardsResult text_to_shards(const TextToShardsOptions& options,
                                  const std::function<void(const TextToShardsProgress&)>& progress = {});

}  // namespace cpf::models::data
