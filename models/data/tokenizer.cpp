#include "models/data/tokenizer.h"

#include <filesystem>
#include <map>
#include <mutex>
#include <unordered_map>

#include "framework/core/error.h"
#include "models/data/document_source.h"
#include "models/data/gpt2_tokenizer.h"
#include "models/data/hf_tokenizer_json.h"
#include "models/data/sentencepiece_tokenizer.h"

namespace cpf::models::data {
namespace {

// Byte-level text: token = byte value, end-of-text 256 (the text source's historical vocabulary).
class ByteTokenizer : public Tokenizer {
 public:
  std::string name() const override { return "bytes"; }
  int64_t vocab_size() const override { return 257; }
  int64_t eot_token() const override { return 256; }
  const std::vector<Special>& special_tokens() const override { return specials_; }

 protected:
  void encode_ordinary(std::string_view text, std::vector<int64_t>& out) const override {
    for (unsigned char c : text) out.push_back(c);
  }
  std::string decode_ordinary(const std::vector<int64_t>& ids) const override {
    std::string text;
    for (int64_t id : ids) {
      if (id >= 0 && id < 256) {
        text.push_back(static_cast<char>(id));
      } else {
        append_token_id(text, id);
      }
    }
    return text;
  }

 private:
  std::vector<Special> specials_{{"<|endoftext|>", 256}};
};

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::vector<int64_t> Tokenizer::encode(std::string_view text, SpecialTokens specials) const {
  std::vector<int64_t> out;
  if (specials == SpecialTokens::as_text) {
    encode_ordinary(text, out);
    return out;
  }
  // Leftmost special token first; of those starting at the same place, the longest.
  size_t begin = 0;
  while (begin < text.size()) {
    size_t best_at = std::string_view::npos;
    const Special* best = nullptr;
    for (const Special& s : special_tokens()) {
      const size_t at = text.find(s.text, begin);
      if (at == std::string_view::npos) continue;
      if (at < best_at || (at == best_at && s.text.size() > best->text.size())) {
        best_at = at;
        best = &s;
      }
    }
    const size_t end = best ? best_at : text.size();
    if (end > begin) encode_ordinary(text.substr(begin, end - begin), out);
    if (!best) break;
    out.push_back(best->id);
    begin = best_at + best->text.size();
  }
  return out;
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids) const {
  // Llama 3 has 256 special tokens: look ids up in a table rather than scanning them per id.
  std::unordered_map<int64_t, const Special*> specials;
  for (const Special& s : special_tokens()) specials.emplace(s.id, &s);
  std::string text;
  std::vector<int64_t> run;
  for (int64_t id : ids) {
    const auto special = specials.find(id);
    if (special == specials.end()) {
      run.push_back(id);
      continue;
    }
    if (!run.empty()) text += decode_ordinary(run);
    run.clear();
    text += special->second->text;
  }
  if (!run.empty()) text += decode_ordinary(run);
  return text;
}

std::shared_ptr<const Tokenizer> load_tokenizer(const std::string& spec) {
  CPF_CHECK(!spec.empty(), "tokenizer: no tokenizer named (", kTokenizerChoices, ")");
  if (spec == "bytes") return std::make_shared<ByteTokenizer>();
  if (spec == "gpt2") return gpt2_tokenizer();
  const bool json = ends_with(spec, ".json"), model = ends_with(spec, ".model");
  CPF_CHECK(json || model, "tokenizer '", spec, "' is not a known name or a tokenizer file (", kTokenizerChoices,
            "); files are recognized by their .json or .model extension");
  std::error_code ec;
  CPF_CHECK(std::filesystem::is_regular_file(spec, ec), "tokenizer file '", spec, "' does not exist");
  // A config names its tokenizer several times (vocabulary, train and eval sources): parse a file once
  // while it is unchanged.
  const auto stamp = std::filesystem::last_write_time(spec, ec).time_since_epoch().count() ^
                     static_cast<int64_t>(std::filesystem::file_size(spec, ec));
  static std::mutex mutex;
  static std::map<std::string, std::pair<int64_t, std::shared_ptr<const Tokenizer>>> loaded;
  std::lock_guard<std::mutex> lock(mutex);
  auto& entry = loaded[spec];
  if (!entry.second || entry.first != stamp) {
    entry = {stamp, json ? load_hf_tokenizer_json(spec) : load_sentencepiece_model(spec)};
  }
  return entry.second;
}

}  // namespace cpf::models::data
