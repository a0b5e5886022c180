#include "models/data/gpt2_tokenizer.h"

#include <nlohmann/json.hpp>

#include "framework/core/error.h"
#include "models/data/byte_level_bpe.h"
#include "models/data/embedded_file.h"

// The two files are assembled into .rodata (models/data/embedded_file.h; CPF_GPT2_DIR is set by
// models/CMakeLists.txt).
__asm__(CPF_EMBED_FILE(cpf_gpt2_encoder_json, CPF_GPT2_DIR "/encoder.json"));
__asm__(CPF_EMBED_FILE(cpf_gpt2_vocab_bpe, CPF_GPT2_DIR "/vocab.bpe"));
CPF_DECLARE_EMBEDDED(cpf_gpt2_encoder_json)
CPF_DECLARE_EMBEDDED(cpf_gpt2_vocab_bpe)

namespace cpf::models::data {
namespace {

ByteLevelBpeSpec gpt2_spec() {
  const std::string where = "gpt2 tokenizer (embedded encoder.json)";
  ByteLevelBpeSpec spec;
  spec.name = "gpt2";
  spec.rule = BpeMergeRule::token_rank;
  const nlohmann::json encoder = nlohmann::json::parse(gpt2_encoder_json());
  for (const auto& [token, id] : encoder.items()) {
    if (token == "<|endoftext|>") {
      CPF_CHECK(id.get<int64_t>() == kGpt2EndOfText, where, ": <|endoftext|> is ", id.get<int64_t>(), ", not 50256");
      continue;  // a special token, never the result of a merge
    }
    spec.vocab.emplace_back(byte_level_to_bytes(token, where), id.get<int64_t>());
  }
  spec.specials = {{"<|endoftext|>", kGpt2EndOfText}};
  spec.eot_token = kGpt2EndOfText;

  // tiktoken ranks a token by its place in vocab.bpe (256 bytes, then merge i at 256 + i) and checks
  // that this equals the encoder.json id; rank = id is what token_rank merges on.
  std::unordered_map<std::string, int64_t> ids(spec.vocab.begin(), spec.vocab.end());
  const std::string_view merges = gpt2_vocab_bpe();
  size_t line_begin = merges.find('\n') + 1;  // the first line is "#version: 0.2"
  int64_t rank = 256;
  while (line_begin < merges.size()) {
    size_t line_end = merges.find('\n', line_begin);
    if (line_end == std::string_view::npos) line_end = merges.size();
    const std::string_view line = merges.substr(line_begin, line_end - line_begin);
    line_begin = line_end + 1;
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    CPF_CHECK(space != std::string_view::npos, "gpt2 tokenizer: vocab.bpe line '", std::string(line),
              "' is not a merge 'a b'");
    const std::string joined = byte_level_to_bytes(line.substr(0, space), "gpt2 vocab.bpe") +
                               byte_level_to_bytes(line.substr(space + 1), "gpt2 vocab.bpe");
    const auto it = ids.find(joined);
    CPF_CHECK(it != ids.end() && it->second == rank, "gpt2 tokenizer: merge ", rank - 256, " ('", std::string(line),
              "') does not make token ", rank, " of encoder.json (mismatched vocabulary files)");
    ++rank;
  }
  CPF_CHECK(rank == kGpt2EndOfText, "gpt2 tokenizer: vocab.bpe has ", rank - 256, " merges, not 50000");
  return spec;
}

}  // namespace

std::string_view gpt2_encoder_json() {
  return {cpf_gpt2_encoder_json_begin, static_cast<size_t>(cpf_gpt2_encoder_json_end - cpf_gpt2_encoder_json_begin)};
}

std::string_view gpt2_vocab_bpe() {
  return {cpf_gpt2_vocab_bpe_begin, static_cast<size_t>(cpf_gpt2_vocab_bpe_end - cpf_gpt2_vocab_bpe_begin)};
}

std::shared_ptr<const Tokenizer> gpt2_tokenizer() {
  static const std::shared_ptr<const Tokenizer> tokenizer = std::make_shared<ByteLevelBpe>(gpt2_spec());
  return tokenizer;
}

}  // namespace cpf::models::data
