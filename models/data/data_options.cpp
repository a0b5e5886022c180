#include "models/data/data_options.h"

#include "models/data/gpt2_tokenizer.h"
#include "models/data/packing.h"
#include "models/data/synthetic_tasks.h"
#include "models/data/text_source.h"
#include "models/data/token_shards.h"
#include "models/data/tokenizer.h"

namespace cpf::models::data {

void validate_data_options(const DataOptions& o) {
  CPF_CHECK(o.source == "synthetic" || o.source == "text" || o.source == "shards", "data: unknown source '", o.source,
            "' (source: synthetic | text | shards)");
  if (o.source == "synthetic") {
    const SyntheticTask task = parse_synthetic_task(o.task);
    CPF_CHECK(o.min_len >= 1 && o.max_len >= o.min_len, "data: synthetic task ", o.task,
              " needs 1 <= min_len <= max_len, got min_len=", o.min_len, " max_len=", o.max_len);
    CPF_CHECK(task != SyntheticTask::addition || o.max_len <= SyntheticSource::kMaxAdditionDigits,
              "data: addition operands of max_len=", o.max_len, " digits overflow int64; use at most ",
              SyntheticSource::kMaxAdditionDigits);
    CPF_CHECK(o.num_examples >= 1, "data: num_examples=", o.num_examples, " must be at least 1");
  } else {
    CPF_CHECK(!o.path.empty(), "data: source '", o.source, "' needs a path (a file or a pattern like data/*.bin)");
  }
  if (o.source == "text") {
    const TextSplit split = parse_text_split(o.text_split);
    CPF_CHECK(split != TextSplit::separator || !o.text_separator.empty(),
              "data: text_split is 'separator' but text_separator is empty");
  }
  CPF_CHECK(o.source != "synthetic" || o.tokenizer.empty(), "data: tokenizer=", o.tokenizer,
            " applies to source text or shards; synthetic tasks have their own 14-token alphabet");
  if (o.source == "shards") {
    CPF_CHECK(o.vocab_size >= 1 && o.vocab_size <= kMaxShardVocabSize, "data: vocab_size=", o.vocab_size,
              " must lie in [1, 2^31]");
    CPF_CHECK(o.eot_token >= 0 && o.eot_token < o.vocab_size, "data: eot_token=", o.eot_token,
              " is outside [0, vocab_size=", o.vocab_size, ")");
  }

  CPF_CHECK(o.layout == "thd" || o.layout == "bshd", "data: unknown layout '", o.layout, "' (layout: thd | bshd)");
  CPF_CHECK(o.bshd_fill == "document" || o.bshd_fill == "window", "data: unknown bshd_fill '", o.bshd_fill,
            "' (bshd_fill: document | window)");
  CPF_CHECK(o.seq_len >= 1, "data: seq_len=", o.seq_len, " must be at least 1");
  CPF_CHECK(o.batch_size >= 1, "data: batch_size=", o.batch_size, " must be at least 1");
  CPF_CHECK(o.pad_multiple >= 1, "data: pad_multiple=", o.pad_multiple, " must be at least 1");
  CPF_CHECK(o.tokens_per_batch >= 0, "data: tokens_per_batch=", o.tokens_per_batch,
            " must be positive (or 0 for batch_size * seq_len)");
  if (o.layout == "bshd") {
    CPF_CHECK(o.tokens_per_batch == 0, "data: tokens_per_batch=", o.tokens_per_batch,
              " applies to layout thd only; bshd batches are batch_size x seq_len");
    CPF_CHECK(o.seq_len % o.pad_multiple == 0, "data: bshd rows of seq_len=", o.seq_len,
              " must be a multiple of pad_multiple=", o.pad_multiple);
  } else {
    const int64_t budget = effective_tokens_per_batch(o);
    CPF_CHECK(budget % o.pad_multiple == 0, "data: tokens_per_batch=", budget,
              " must be a multiple of pad_multiple=", o.pad_multiple);
    CPF_CHECK(round_up(o.seq_len, o.pad_multiple) <= budget, "data: a piece of seq_len=", o.seq_len,
              " tokens padded to a multiple of pad_multiple=", o.pad_multiple, " (",
              round_up(o.seq_len, o.pad_multiple), ") does not fit in tokens_per_batch=", budget);
  }
}

std::string effective_tokenizer(const DataOptions& o) {
  if (o.source == "synthetic") return "";
  if (!o.tokenizer.empty()) return o.tokenizer;
  if (o.source == "text") return "bytes";
  return o.eot_token == kGpt2EndOfText && o.vocab_size >= kGpt2VocabSize ? "gpt2" : "";
}

namespace {

// The shards' tokenizer must agree with data.eot_token and data.vocab_size, or its text would be wrong.
std::shared_ptr<const Tokenizer> shard_tokenizer(const DataOptions& o) {
  const std::string spec = effective_tokenizer(o);
  if (spec.empty()) return nullptr;
  auto tok = load_tokenizer(spec);
  CPF_CHECK(tok->eot_token() == o.eot_token, "data: tokenizer ", spec, " ends documents with id ", tok->eot_token(),
            " but eot_token=", o.eot_token, "; set data.eot_token: ", tok->eot_token(),
            " or name the tokenizer the shards were made with");
  CPF_CHECK(tok->vocab_size() <= o.vocab_size, "data: tokenizer ", spec, " has ", tok->vocab_size(),
            " tokens, more than vocab_size=", o.vocab_size, "; set data.vocab_size: ", tok->vocab_size());
  return tok;
}

}  // namespace

int64_t data_source_vocab_size(const DataOptions& o) {
  if (o.source == "synthetic") return synthetic_vocab::kSize;
  if (o.source == "text") return load_tokenizer(effective_tokenizer(o))->vocab_size();
  shard_tokenizer(o);  // a tokenizer that disagrees with the shards is a config error, found here
  return o.vocab_size;
}

int64_t effective_tokens_per_batch(const DataOptions& o) {
  if (o.layout == "thd" && o.tokens_per_batch > 0) return o.tokens_per_batch;
  return o.batch_size * o.seq_len;
}

std::shared_ptr<const DocumentSource> make_document_source(const DataOptions& o) {
  validate_data_options(o);
  if (o.source == "synthetic") {
    return std::make_shared<SyntheticSource>(SyntheticOptions{.task = parse_synthetic_task(o.task),
                                                              .min_len = o.min_len,
                                                              .max_len = o.max_len,
                                                              .num_examples = o.num_examples,
                                                              .seed = o.seed});
  }
  if (o.source == "text") {
    return std::make_shared<TextSource>(TextOptions{.path = o.path,
                                                    .split = parse_text_split(o.text_split),
                                                    .separator = o.text_separator,
                                                    .tokenizer = load_tokenizer(effective_tokenizer(o))});
  }
  return std::make_shared<TokenShardSource>(ShardOptions{
      .path = o.path, .eot_token = o.eot_token, .vocab_size = o.vocab_size, .tokenizer = shard_tokenizer(o)});
}

}  // namespace cpf::models::data
