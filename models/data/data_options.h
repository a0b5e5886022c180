#pragma once
// DataOptions: the `data:` section of a training config. Field names are the YAML keys; docs/data.md
// documents each one. validate_data_options() checks every field and their combination up front, with
// messages that name the key and the value.
#include <cstdint>
#include <memory>
#include <string>

#include "models/data/deprecated_namespace.h"
#include "models/data/document_source.h"

namespace cpf::models::data {

struct DataOptions {
  std::string source = "synthetic";  // synthetic | text | shards

  // ---- synthetic ----
  std::string task = "addition";  // addition | sort | copy | reverse
  int64_t min_len = 1;            // addition: digits per operand; sort/copy/reverse: list items
  int64_t max_len = 3;
  int64_t num_examples = 100000;  // training examples (documents per epoch)

  // ---- text and shards ----
  std::string path;                        // a file or a pattern with '*' / '?' in the file name
  std::string text_split = "blank_lines";  // text: blank_lines | separator | file
  std::string text_separator;              // text: the separator string when text_split = separator
  int64_t eot_token = 50256;               // shards: the end-of-text id (GPT-2's by default)
  int64_t vocab_size = 50257;              // shards: ids must lie below it
  // text: how text becomes tokens ("" = bytes); shards: the tokenizer they were made with, for
  // generate and samples ("" = gpt2 when eot_token is 50256, else none). bytes | gpt2 | a .json / .model file
  std::string tokenizer;

  // ---- batches ----
  std::string layout = "thd";          // thd (packed documents) | bshd (fixed (B, T) rows)
  std::string bshd_fill = "document";  // bshd: document (one piece per row) | window (contiguous text)
  int64_t seq_len = 256;               // thd: longest piece; bshd: T
  int64_t batch_size = 8;              // bshd: B; thd: tokens_per_batch defaults to batch_size * seq_len
  int64_t tokens_per_batch = 0;        // thd: storage tokens per batch (0 = batch_size * seq_len)
  int64_t pad_multiple = 1;            // slot/row padding; 2 * cp_size (or a multiple) under CP
  int64_t total_batch_tokens = 0;      // per optimizer step over the DP ranks (gradient accumulation); 0 = one batch

  // ---- order ----
  uint64_t seed = 1234;
  bool shuffle = true;
};

// Throws on any invalid field or combination (file existence is checked when the source is opened).
void validate_data_options(const DataOptions& options);

// tokens_per_batch with its default applied (thd), or batch_size * seq_len (bshd).
int64_t effective_tokens_per_batch(const DataOptions& options);

// The tokenizer the options name once defaults apply: "bytes", "gpt2", a file, or "" (synthetic data,
// and shards whose end-of-text is not GPT-2's when data.tokenizer is not set).
std::string effective_tokenizer(const DataOptions& options);

// Token ids of the source lie below it (loads the tokenizer of a text source).
int64_t data_source_vocab_size(const DataOptions& options);

// Validates the options and opens the source they name (reads text files, maps token shards).
std::shared_ptr<const DocumentSource> make_document_source(const DataOptions& options);

}  // namespace cpf::models::data
