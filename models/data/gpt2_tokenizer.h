#pragma once
// GPT-2's byte-level BPE, built in: OpenAI's encoder.json (50,257 tokens) and vocab.bpe (50,000
// merges), from data/tokenizers/gpt2/, are compiled into the library (models/CMakeLists.txt), so the
// tokenizer needs no file at run time wherever the binary is carried. Its ids equal tiktoken's `gpt2`
// encoding (merge rule token_rank); <|endoftext|> is 50256 and the only special token.
#include <memory>
#include <string_view>

#include "models/data/deprecated_namespace.h"
#include "models/data/tokenizer.h"

namespace cpf::models::data {

inline constexpr int64_t kGpt2EndOfText = 50256;
inline constexpr int64_t kGpt2VocabSize = 50257;

// Parsed once per process (about 0.1 s) and shared.
std::shared_ptr<const Tokenizer> gpt2_tokenizer();

// The embedded vocabulary files, as they are in data/tokenizers/gpt2/.
std::string_view gpt2_encoder_json();
std::string_view gpt2_vocab_bpe();

}  // namespace cpf::models::data
