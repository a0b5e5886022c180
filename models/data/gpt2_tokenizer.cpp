#include "models/data/gpt2_tokenizer.h"

#include <nlohmann/json.hpp>

#include "framework/core/error.h"
#include "models/data/byte_level_bpe.h"

// The two files are assembled into .rodata (CPF_GPT2_DIR is set by models/CMakeLists.txt, which
// also makes this object depend on them). ccache never caches a source with .incbin, so a changed
// file is always picked up.
#define CPF_GPT2_STR2(x) #x
#define CPF_GPT2_STR(x) CPF_GPT2_STR2(x)
#define CPF_GPT2_EMBED(symbol, file)    \
  ".section .rodata\n"                  \
  ".balign 16\n"                        \
  ".globl " #symbol                     \
  "_begin\n"                            \
  ".hidden " #symbol "_begin\n" #symbol \
  "_begin:\n"                           \
  ".incbin \"" CPF_GPT2_DIR "/" file    \
  "\"\n"                                \
  ".globl " #symbol                     \
  "_end\n"                              \
  ".hidden " #symbol "_end\n" #symbol   \
  "_end:\n"                             \
  ".byte 0\n"                           \
  ".previous\n"

__asm__(CPF_GPT2_EMBED(cpf_gpt2_encoder_json, "encoder.json"));
__asm__(CPF_GPT2_EMBED(cpf_gpt2_vocab_bpe, "vocab.bpe"));

extern "C" {
extern const char cpf_gpt2_encoder_json_begin[] __attribute__((visibility("hidden")));
extern const char cpf_gpt2_encoder_json_end[] __attribute__((visibility("hidden")));
extern const char cpf_gpt2_vocab_bpe_begin[] __attribute__((visibility("hidden")));
extern const char cpf_gpt2_vocab_bpe_end[] __attribute__((visibility("hidden")));
}

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
