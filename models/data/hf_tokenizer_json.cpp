#include "models/data/hf_tokenizer_json.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "framework/core/error.h"
#include "models/data/byte_level_bpe.h"

namespace cpf::models::data {
namespace {

using nlohmann::json;

constexpr const char* kEotCandidates[] = {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|im_end|>"};

// A field that is absent or null reads as `fallback`.
template <class T>
T field_or(const json& object, const char* key, T fallback) {
  const auto it = object.find(key);
  return it == object.end() || it->is_null() ? fallback : it->get<T>();
}

void read_model(const json& model, const std::string& where, ByteLevelBpeSpec& spec) {
  CPF_CHECK(model.is_object() && field_or<std::string>(model, "type", "") == "BPE", where, ": model.type is ",
            model.is_object() ? model.value("type", json("missing")).dump() : "missing",
            "; only BPE models are supported (WordPiece, Unigram and WordLevel are not byte-level BPE)");
  CPF_CHECK(field_or<double>(model, "dropout", 0.0) == 0.0, where,
            ": model.dropout is set; BPE dropout is not "
            "supported (encoding would be random)");
  CPF_CHECK(!field_or<bool>(model, "byte_fallback", false), where,
            ": model.byte_fallback is true, which is SentencePiece-style BPE, not byte-level BPE");
  CPF_CHECK(field_or<std::string>(model, "continuing_subword_prefix", "").empty() &&
                field_or<std::string>(model, "end_of_word_suffix", "").empty(),
            where, ": model.continuing_subword_prefix / end_of_word_suffix are set (not byte-level BPE)");
  spec.whole_piece_first = field_or<bool>(model, "ignore_merges", false);
  CPF_CHECK(model.contains("vocab") && model["vocab"].is_object(), where, ": model.vocab is missing");
  for (const auto& [token, id] : model["vocab"].items()) {
    spec.vocab.emplace_back(byte_level_to_bytes(token, where), id.get<int64_t>());
  }
  CPF_CHECK(model.contains("merges") && model["merges"].is_array(), where, ": model.merges is missing");
  for (const json& merge : model["merges"]) {
    std::string a, b;
    if (merge.is_string()) {
      const std::string text = merge.get<std::string>();
      const size_t space = text.find(' ');
      CPF_CHECK(space != std::string::npos && text.find(' ', space + 1) == std::string::npos, where, ": merge '", text,
                "' is not 'a b'");
      a = text.substr(0, space), b = text.substr(space + 1);
    } else {
      CPF_CHECK(merge.is_array() && merge.size() == 2, where, ": merge ", merge.dump(), " is not [a, b]");
      a = merge[0].get<std::string>(), b = merge[1].get<std::string>();
    }
    spec.merges.emplace_back(byte_level_to_bytes(a, where), byte_level_to_bytes(b, where));
  }
}

// ByteLevel (GPT-2's pattern) or Sequence[Split(regex, Isolated), ByteLevel(use_regex: false)].
void read_pre_tokenizer(const json& pre, const std::string& where, ByteLevelBpeSpec& spec) {
  const std::string supported =
      "; supported: ByteLevel with use_regex, or Sequence of Split (Regex, Isolated) and ByteLevel without it";
  CPF_CHECK(pre.is_object(), where, ": pre_tokenizer is missing", supported);
  const std::string type = field_or<std::string>(pre, "type", "");
  if (type == "ByteLevel") {
    CPF_CHECK(field_or<bool>(pre, "use_regex", true), where, ": a lone ByteLevel pre_tokenizer with use_regex false",
              " would not split words", supported);
    spec.pattern = kGpt2Pattern;
    spec.add_prefix_space = field_or<bool>(pre, "add_prefix_space", false);
    return;
  }
  CPF_CHECK(type == "Sequence" && pre.contains("pretokenizers") && pre["pretokenizers"].size() == 2, where,
            ": pre_tokenizer ", pre.dump().substr(0, 200), " is not supported", supported);
  const json& split = pre["pretokenizers"][0];
  const json& byte_level = pre["pretokenizers"][1];
  CPF_CHECK(field_or<std::string>(split, "type", "") == "Split" && split.contains("pattern") &&
                split["pattern"].contains("Regex"),
            where, ": the first pre-tokenizer of the Sequence is not a Split on a Regex", supported);
  CPF_CHECK(field_or<std::string>(split, "behavior", "") == "Isolated" && !field_or<bool>(split, "invert", false),
            where, ": Split behavior '", field_or<std::string>(split, "behavior", ""), "' (invert ",
            field_or<bool>(split, "invert", false), ") is not supported (only Isolated, not inverted)");
  CPF_CHECK(
      field_or<std::string>(byte_level, "type", "") == "ByteLevel" && !field_or<bool>(byte_level, "use_regex", true),
      where, ": the second pre-tokenizer of the Sequence is not ByteLevel with use_regex false", supported);
  spec.pattern = split["pattern"]["Regex"].get<std::string>();
  spec.add_prefix_space = field_or<bool>(byte_level, "add_prefix_space", false);
}

void read_added_tokens(const json& file, const std::string& where, ByteLevelBpeSpec& spec) {
  if (file.contains("added_tokens") && file["added_tokens"].is_array()) {
    for (const json& t : file["added_tokens"]) spec.specials.push_back({t.at("content"), t.at("id").get<int64_t>()});
  }
  for (const char* candidate : kEotCandidates) {
    for (const Tokenizer::Special& s : spec.specials) {
      if (s.text == candidate && spec.eot_token < 0) spec.eot_token = s.id;
    }
  }
  CPF_CHECK(spec.eot_token >= 0, where, ": no end-of-text token among added_tokens (looked for <|endoftext|>, ",
            "<|end_of_text|>, </s>, <eos>, <|im_end|>); documents need one to be told apart");
}

}  // namespace

std::shared_ptr<const Tokenizer> load_hf_tokenizer_json(const std::string& path) {
  const std::string where = "tokenizer file '" + path + "'";
  std::ifstream in(path, std::ios::binary);
  CPF_CHECK(in.good(), where, " cannot be opened");
  std::ostringstream content;
  content << in.rdbuf();
  json file;
  try {
    file = json::parse(content.str());
  } catch (const json::exception& e) {
    CPF_FAIL(where, " is not valid JSON (", e.what(), ")");
  }
  CPF_CHECK(file.is_object() && file.contains("model"), where, " has no \"model\" (not a Hugging Face tokenizer.json)");
  ByteLevelBpeSpec spec;
  const json normalizer = file.value("normalizer", json());
  spec.nfc = normalizer.is_object() && normalizer.value("type", "") == "NFC";
  CPF_CHECK(normalizer.is_null() || spec.nfc, where, ": normalizer ", normalizer.dump().substr(0, 120),
            " is not supported (byte-level BPE tokenizers have none, or NFC)");
  spec.name = path;
  spec.rule = BpeMergeRule::merge_list;
  try {
    read_model(file["model"], where, spec);
    read_pre_tokenizer(file.value("pre_tokenizer", json()), where, spec);
    read_added_tokens(file, where, spec);
  } catch (const json::exception& e) {
    CPF_FAIL(where, ": a field has the wrong type (", e.what(), ")");
  }
  return std::make_shared<ByteLevelBpe>(std::move(spec));
}

}  // namespace cpf::models::data
