#pragma once
// SentencePiece models (Llama 1/2, Mistral, T5, Gemma...) through Debian's libsentencepiece:
// load a `.model` file, or train one from text files as the Llama family did.
//
// The end-of-text token is the model's eos (</s>); a model without one is refused. eos, bos and the
// other control pieces are the special tokens (matched in prompts by their text, e.g. "</s>").
// Ordinary text is encoded without bos/eos; the model's own normalizer applies, so decode(encode(x))
// equals x only for models that do not normalize (those train_sentencepiece writes: identity rule,
// byte fallback, whitespace kept).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "models/data/deprecated_namespace.h"
#include "models/data/tokenizer.h"

namespace cpf::models::data {

std::shared_ptr<const Tokenizer> load_sentencepiece_model(const std::string& path);

struct SentencePieceTraining {
  std::vector<std::string> inputs;  // text files; every line is a sentence
  std::string model_prefix;         // writes <prefix>.model and <prefix>.vocab
  int64_t vocab_size = 8000;
  std::string model_type = "bpe";  // bpe | unigram
  int64_t max_sentences = 0;       // input_sentence_size: 0 = every line; else a random sample of that many
};

// Trains with Llama's settings (bpe, byte_fallback, split_digits, identity normalization, whitespace
// kept; unk 0, bos 1, eos 2) and returns the .model path. Throws naming the inputs and SentencePiece's
// message when training fails (e.g. a vocab_size larger than the text supports).
std::string train_sentencepiece(const SentencePieceTraining& options);

}  // namespace cpf::models::data
