#include "models/data/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <filesystem>
#include <unordered_map>

#include "framework/core/error.h"
#include "models/data/document_source.h"

namespace cpf::models::data {
namespace {

class SentencePieceTokenizer : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& path) : path_(path) {
    const auto status = processor_.Load(path);
    CPF_CHECK(status.ok(), "tokenizer file '", path, "' is not a SentencePiece model (", status.ToString(), ")");
    CPF_CHECK(processor_.eos_id() >= 0, "SentencePiece model '", path,
              "' has no end-of-sentence piece (eos_id = -1); cpformer needs one to end documents");
    for (int id = 0; id < processor_.GetPieceSize(); ++id) {
      if (processor_.IsControl(id)) specials_.push_back({processor_.IdToPiece(id), id});
    }
  }

  std::string name() const override { return path_; }
  int64_t vocab_size() const override { return processor_.GetPieceSize(); }
  int64_t eot_token() const override { return processor_.eos_id(); }
  const std::vector<Special>& special_tokens() const override { return specials_; }

 protected:
  void encode_ordinary(std::string_view text, std::vector<int64_t>& out) const override {
    std::vector<int> ids;
    const auto status = processor_.Encode(text, &ids);
    CPF_CHECK(status.ok(), "SentencePiece model '", path_, "' cannot encode the text (", status.ToString(), ")");
    out.insert(out.end(), ids.begin(), ids.end());
  }

  std::string decode_ordinary(const std::vector<int64_t>& ids) const override {
    // Runs of valid ids go to SentencePiece together (pieces join across them); others print as <id>.
    std::string text;
    std::vector<int> run;
    const auto flush = [&] {
      if (run.empty()) return;
      text += processor_.DecodeIds(run);
      run.clear();
    };
    for (int64_t id : ids) {
      if (id >= 0 && id < vocab_size()) {
        run.push_back(static_cast<int>(id));
      } else {
        flush();
        append_token_id(text, id);
      }
    }
    flush();
    return text;
  }

 private:
  std::string path_;
  sentencepiece::SentencePieceProcessor processor_;
  std::vector<Special> specials_;
};

}  // namespace

std::shared_ptr<const Tokenizer> load_sentencepiece_model(const std::string& path) {
  return std::make_shared<SentencePieceTokenizer>(path);
}

std::string train_sentencepiece(const SentencePieceTraining& o) {
  CPF_CHECK(!o.inputs.empty(), "train tokenizer: no input text files");
  CPF_CHECK(!o.model_prefix.empty(), "train tokenizer: no output prefix");
  CPF_CHECK(o.vocab_size >= 16 && o.vocab_size <= (int64_t{1} << 31) - 1, "train tokenizer: vocab size ", o.vocab_size,
            " must lie in [16, 2^31)");
  CPF_CHECK(o.model_type == "bpe" || o.model_type == "unigram", "train tokenizer: model type '", o.model_type,
            "' is not bpe or unigram");
  CPF_CHECK(o.max_sentences >= 0, "train tokenizer: max sentences ", o.max_sentences, " must be >= 0");
  std::string inputs;
  for (const std::string& file : o.inputs) {
    std::error_code ec;
    CPF_CHECK(std::filesystem::is_regular_file(file, ec), "train tokenizer: input file '", file, "' does not exist");
    CPF_CHECK(file.find(',') == std::string::npos, "train tokenizer: input file '", file,
              "' has a comma in its name, which SentencePiece reads as a list separator; rename it");
    inputs += (inputs.empty() ? "" : ",") + file;
  }
  const std::unordered_map<std::string, std::string> args = {
      {"input", inputs},
      {"model_prefix", o.model_prefix},
      {"vocab_size", std::to_string(o.vocab_size)},
      {"model_type", o.model_type},
      {"byte_fallback", "true"},
      {"split_digits", "true"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"allow_whitespace_only_pieces", "true"},
      {"character_coverage", "0.99995"},
      {"input_sentence_size", std::to_string(o.max_sentences)},
      {"shuffle_input_sentence", "true"},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
  };
  const auto status = sentencepiece::SentencePieceTrainer::Train(args);
  CPF_CHECK(status.ok(), "train tokenizer: SentencePiece could not train on ", inputs, " (", status.ToString(), ")");
  return o.model_prefix + ".model";
}

}  // namespace cpf::models::data
