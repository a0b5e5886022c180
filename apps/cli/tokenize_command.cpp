// `cpformer tokenize` (text files -> llm.c token shards, models/data/text_to_shards.h) and
// `cpformer train-tokenizer` (a SentencePiece model from text files): their command specs
// (command_table.h), option checks and progress output.
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "apps/cli/cli.h"
#include "apps/cli/command_table.h"
#include "apps/trainer/trainer.h"
#include "framework/core/error.h"
#include "models/data/file_glob.h"
#include "models/data/sentencepiece_tokenizer.h"
#include "models/data/text_to_shards.h"

namespace cpf::trainer {
namespace {

using Clock = std::chrono::steady_clock;

std::string format(const char* fmt, double a, double b = 0, double c = 0) {
  char buf[128];
  std::snprintf(buf, sizeof buf, fmt, a, b, c);
  return buf;
}

// Missing inputs are unreadable data (exit 3), found before anything is written.
void check_inputs_exist(const std::vector<std::string>& inputs) {
  for (const std::string& input : inputs) {
    try {
      models::data::expand_file_pattern(input, "input");
    } catch (const Error& e) {
      throw DataError(e.message());
    }
  }
}

models::data::TextToShardsOptions tokenize_options(const CommandLine& line) {
  if (line.positional.empty()) throw UsageError("'tokenize' needs at least one input text file", line.command);
  const auto output = line.value("--output");
  if (!output) throw UsageError("'tokenize' needs --output PREFIX (writes PREFIX_train_000000.bin, ...)", line.command);
  models::data::TextToShardsOptions o;
  o.inputs = line.positional;
  o.output_prefix = *output;
  try {
    o.split = models::data::parse_text_split(line.value("--text-split").value_or("blank_lines"));
    o.separator = line.value("--text-separator").value_or("");
    if (o.split == models::data::TextSplit::separator && o.separator.empty()) {
      throw UsageError("--text-split separator needs --text-separator S", line.command);
    }
    if (const auto type = line.value("--token-type")) o.type = models::data::parse_shard_token_type(*type);
  } catch (const Error& e) {
    throw UsageError(e.message(), line.command);
  }
  if (const auto n = line.value("--shard-tokens")) {
    o.shard_tokens = parse_integer_option("--shard-tokens", *n);
    if (o.shard_tokens < 1 || o.shard_tokens > INT32_MAX) {
      throw UsageError("--shard-tokens " + *n + ": expected 1 to 2147483647 (the header counts tokens in an int32)",
                       line.command);
    }
  }
  if (const auto n = line.value("--val-documents")) {
    o.val_documents = parse_integer_option("--val-documents", *n);
    if (o.val_documents < 0) throw UsageError("--val-documents " + *n + ": expected 0 or more", line.command);
  }
  const std::filesystem::path folder = std::filesystem::path(o.output_prefix).parent_path();
  std::error_code ec;
  if (!folder.empty() && !std::filesystem::is_directory(folder, ec)) {
    throw UsageError("--output " + o.output_prefix + ": the folder '" + folder.string() + "' does not exist",
                     line.command);
  }
  check_inputs_exist(o.inputs);
  const std::string spec = line.value("--tokenizer").value_or("gpt2");
  try {
    o.tokenizer = models::data::load_tokenizer(spec);
  } catch (const Error& e) {
    throw UsageError("--tokenizer " + spec + ": " + e.message(), line.command);
  }
  if (o.type == models::data::ShardTokenType::uint16 && o.tokenizer->vocab_size() > 65536) {
    throw UsageError("--token-type uint16: tokenizer " + spec + " has " + std::to_string(o.tokenizer->vocab_size()) +
                         " tokens, more than uint16 ids hold; use uint32 (the default for it)",
                     line.command);
  }
  return o;
}

// "tokenize: 12.1/40.0 MB (30%) | 2,345 docs | 3.2M tokens | 1.9 MB/s, 0.5M tokens/s"
std::string progress_line(const models::data::TextToShardsProgress& p, double seconds) {
  const double mb = 1e-6 * static_cast<double>(p.bytes_done), total = 1e-6 * static_cast<double>(p.bytes_total);
  const double pct =
      p.bytes_total > 0 ? 100.0 * static_cast<double>(p.bytes_done) / static_cast<double>(p.bytes_total) : 100;
  const double rate = seconds > 0 ? 1.0 / seconds : 0;
  return "tokenize: " + format("%.1f/%.1f MB (%.0f%%)", mb, total, pct) + " | " + std::to_string(p.documents) +
         " docs | " + format("%.2fM tokens", 1e-6 * static_cast<double>(p.tokens)) + " | " +
         format("%.2f MB/s, %.3fM tokens/s", mb * rate, 1e-6 * static_cast<double>(p.tokens) * rate);
}

int run_tokenize(const CommandLine& line, std::ostream& out, std::ostream& err, bool terminal) {
  const models::data::TextToShardsOptions o = tokenize_options(line);
  const auto start = Clock::now();
  auto last = start;
  const auto seconds = [&](Clock::time_point t) { return std::chrono::duration<double>(t - start).count(); };
  // A bar redrawn in place on a terminal (and left at 100% at the end); otherwise a line every 10 s.
  models::data::TextToShardsProgress latest;
  const auto draw = [&](const models::data::TextToShardsProgress& p, Clock::time_point now) {
    if (!terminal) {
      out << progress_line(p, seconds(now)) << std::endl;
      return;
    }
    const int width = 24;
    const double done =
        p.bytes_total > 0 ? static_cast<double>(p.bytes_done) / static_cast<double>(p.bytes_total) : 1.0;
    const auto filled = static_cast<size_t>(width * std::min(done, 1.0));
    out << "\r[" << std::string(filled, '#') << std::string(static_cast<size_t>(width) - filled, '.') << "] "
        << progress_line(p, seconds(now)) << std::flush;
  };
  const auto progress = [&](const models::data::TextToShardsProgress& p) {
    latest = p;
    const auto now = Clock::now();
    if (std::chrono::duration<double>(now - last).count() < (terminal ? 0.2 : 10.0)) return;
    last = now;
    draw(p, now);
  };
  const models::data::TextToShardsResult r = models::data::text_to_shards(o, progress);
  const double elapsed = std::max(seconds(Clock::now()), 1e-9);
  if (terminal) {
    draw(latest, Clock::now());
    out << "\n";
  }
  const int64_t tokens = r.train_tokens + r.val_tokens;
  out << "tokenize: " << r.documents << " documents from " << r.input_files.size() << " file(s), "
      << format("%.2f MB", 1e-6 * static_cast<double>(r.bytes)) << " -> " << tokens << " tokens ("
      << o.tokenizer->name() << ", " << (r.type == models::data::ShardTokenType::uint16 ? "uint16" : "uint32")
      << ") in "
      << format("%.2f s: %.2f MB/s, %.0f tokens/s", elapsed, 1e-6 * static_cast<double>(r.bytes) / elapsed,
                static_cast<double>(tokens) / elapsed)
      << "\n";
  for (const std::string& f : r.val_files) out << "  val   " << f << "\n";
  for (const std::string& f : r.train_files) out << "  train " << f << "\n";
  out << "train on them with data.source: shards, data.path: " << o.output_prefix
      << "_train_*.bin, data.tokenizer: " << o.tokenizer->name() << ", data.eot_token: " << o.tokenizer->eot_token()
      << ", data.vocab_size: " << o.tokenizer->vocab_size();
  if (!r.val_files.empty()) out << ", run.eval_path: " << o.output_prefix << "_val_*.bin";
  out << std::endl;
  (void)err;
  return kExitOk;
}

int run_train_tokenizer(const CommandLine& line, std::ostream& out, std::ostream& err, bool) {
  if (line.positional.empty()) throw UsageError("'train-tokenizer' needs at least one input text file", line.command);
  const auto output = line.value("--output");
  if (!output) throw UsageError("'train-tokenizer' needs --output PREFIX (writes PREFIX.model)", line.command);
  const auto vocab = line.value("--vocab-size");
  if (!vocab) throw UsageError("'train-tokenizer' needs --vocab-size N", line.command);
  models::data::SentencePieceTraining o{.inputs = {}, .model_prefix = *output};
  o.vocab_size = parse_integer_option("--vocab-size", *vocab);
  o.model_type = line.value("--model-type").value_or("bpe");
  if (const auto n = line.value("--max-sentences")) o.max_sentences = parse_integer_option("--max-sentences", *n);
  if (o.vocab_size < 16) throw UsageError("--vocab-size " + *vocab + ": expected at least 16", line.command);
  if (o.model_type != "bpe" && o.model_type != "unigram") {
    throw UsageError("--model-type " + o.model_type + ": expected bpe or unigram", line.command);
  }
  if (o.max_sentences < 0) throw UsageError("--max-sentences: expected 0 (all) or more", line.command);
  check_inputs_exist(line.positional);
  for (const std::string& input : line.positional) {
    for (const std::string& file : models::data::expand_file_pattern(input, "input")) o.inputs.push_back(file);
  }
  const auto start = Clock::now();
  const std::string model = models::data::train_sentencepiece(o);  // SentencePiece logs its progress on stderr
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  const auto tok = models::data::load_tokenizer(model);
  out << "train-tokenizer: wrote " << model << " (" << tok->vocab_size() << " pieces, " << o.model_type
      << ", end-of-text " << tok->eot_token() << ") from " << o.inputs.size() << " file(s) in "
      << format("%.1f s", elapsed) << "\nuse it with data.tokenizer: " << model << " or cpformer tokenize --tokenizer "
      << model << std::endl;
  (void)err;
  return kExitOk;
}

}  // namespace

CommandSpec tokenize_command() {
  return {.name = "tokenize",
          .arguments = "TEXT [TEXT ...]",
          .summary = "turn text files into llm.c token shards (uint16, or uint32 for vocabularies > 65536)",
          .description =
              "TEXT is a file or a pattern with * and ? in the file name. Files are cut into documents as\n"
              "source: text cuts them; every document is written as end-of-text then its tokens.\n"
              "Writes PREFIX_train_000000.bin, ... (and PREFIX_val_000000.bin with --val-documents).",
          .options = {{"--output", "PREFIX", "where the shards go: PREFIX_train_NNNNNN.bin (required)"},
                      {"--tokenizer", "T", "gpt2 (default), bytes, a tokenizer.json or a SentencePiece .model"},
                      {"--text-split", "S", "blank_lines (default), separator or file"},
                      {"--text-separator", "S", "the separator string for --text-split separator"},
                      {"--val-documents", "N", "the first N documents go to PREFIX_val_*.bin (default 0)"},
                      {"--shard-tokens", "N", "tokens per shard (default 100000000, llm.c's)"},
                      {"--token-type", "T", "uint16 or uint32 (default: uint16 when the vocabulary fits)"}},
          .run = run_tokenize};
}

CommandSpec train_tokenizer_command() {
  return {.name = "train-tokenizer",
          .arguments = "TEXT [TEXT ...]",
          .summary = "train a SentencePiece tokenizer (Llama's settings) on text files",
          .description =
              "Every line of the text files is a sentence. BPE with byte fallback, digits split, no\n"
              "normalization (text round-trips); unk 0, bos 1, eos 2 (end-of-text). Writes PREFIX.model.",
          .options = {{"--output", "PREFIX", "writes PREFIX.model and PREFIX.vocab (required)"},
                      {"--vocab-size", "N", "pieces in the vocabulary, at least 16 (required)"},
                      {"--model-type", "T", "bpe (default) or unigram"},
                      {"--max-sentences", "N", "train on a random sample of N lines; 0 = all (default)"}},
          .run = run_train_tokenizer};
}

}  // namespace cpf::trainer
