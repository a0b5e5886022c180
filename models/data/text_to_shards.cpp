#include "models/data/text_to_shards.h"

#include <filesystem>

#include "framework/core/error.h"
#include "models/data/file_glob.h"
#include "models/data/token_shards.h"

namespace cpf::models::data {
namespace {

void check_options(const TextToShardsOptions& o, ShardTokenType type) {
  CPF_CHECK(!o.inputs.empty(), "tokenize: no input text files");
  CPF_CHECK(o.tokenizer, "tokenize: no tokenizer");
  CPF_CHECK(o.val_documents >= 0, "tokenize: val documents ", o.val_documents, " must be >= 0");
  CPF_CHECK(o.split != TextSplit::separator || !o.separator.empty(),
            "tokenize: text split 'separator' needs a separator string");
  const int64_t limit = type == ShardTokenType::uint16 ? 65536 : kMaxShardVocabSize;
  CPF_CHECK(o.tokenizer->vocab_size() <= limit, "tokenize: tokenizer ", o.tokenizer->name(), " has ",
            o.tokenizer->vocab_size(), " tokens, more than uint16 shards hold (65536); write uint32 shards");
}

}  // namespace

TextToShardsResult text_to_shards(const TextToShardsOptions& o,
                                  const std::function<void(const TextToShardsProgress&)>& progress) {
  TextToShardsResult result;
  result.type = o.type.value_or(o.tokenizer ? shard_token_type_for(o.tokenizer->vocab_size()) : ShardTokenType::uint16);
  check_options(o, result.type);
  TextToShardsProgress p;
  for (const std::string& input : o.inputs) {
    for (const std::string& file : expand_file_pattern(input, "tokenize")) {
      result.input_files.push_back(file);
      std::error_code ec;
      p.bytes_total += static_cast<int64_t>(std::filesystem::file_size(file, ec));
      CPF_CHECK(!ec, "tokenize: cannot read the size of '", file, "' (", ec.message(), ")");
    }
  }
  const int64_t eot = o.tokenizer->eot_token();
  std::unique_ptr<ShardWriter> val;
  if (o.val_documents > 0) {
    val = std::make_unique<ShardWriter>(ShardWriterOptions{
        .prefix = o.output_prefix + "_val", .shard_tokens = o.shard_tokens, .type = result.type, .eot_token = eot});
  }
  ShardWriter train(
      {.prefix = o.output_prefix + "_train", .shard_tokens = o.shard_tokens, .type = result.type, .eot_token = eot});
  for (const std::string& file : result.input_files) {
    // One file in memory at a time, cut into documents exactly as `source: text` cuts it.
    const TextSource text({.path = file, .split = o.split, .separator = o.separator, .tokenizer = nullptr});
    const int64_t file_start = p.bytes_done;
    for (int64_t i = 0; i < text.num_documents(); ++i) {
      const std::string doc = text.document_text(i);
      const std::vector<int64_t> ids = o.tokenizer->encode(doc);
      (val && p.documents < o.val_documents ? *val : train).add_document(ids);
      ++p.documents;
      p.tokens += static_cast<int64_t>(ids.size()) + 1;
      p.bytes_done += static_cast<int64_t>(doc.size());
      if (progress) progress(p);
    }
    p.bytes_done = file_start + static_cast<int64_t>(std::filesystem::file_size(file));  // separators included
    if (progress) progress(p);
  }
  CPF_CHECK(p.documents > o.val_documents, "tokenize: the inputs hold ", p.documents,
            " documents and --val-documents takes ", o.val_documents, ", leaving none to train on; lower it");
  if (val) {
    result.val_files = val->finish();
    result.val_tokens = val->tokens_written();
    result.val_documents = o.val_documents;
  }
  result.train_files = train.finish();
  result.train_tokens = train.tokens_written();
  result.documents = p.documents;
  result.bytes = p.bytes_total;
  return result;
}

}  // namespace cpf::models::data
