#pragma once
// Tokenizer: text <-> token ids, the one interface the text source, `cpformer tokenize` and
// `cpformer generate` use. Implementations:
//   bytes          token = byte value (0..255), end-of-text 256, vocabulary 257 (tokenizer.cpp)
//   gpt2           GPT-2's byte-level BPE, built in (gpt2_tokenizer.h); ids equal tiktoken's `gpt2`
//   *.json         a Hugging Face tokenizer.json of the byte-level BPE kind (hf_tokenizer_json.h)
//   *.model        a SentencePiece model (sentencepiece_tokenizer.h)
//
// Special tokens (e.g. "<|endoftext|>") are recognized in the text only when encode() is asked to
// (prompts); training text is encoded as plain text, so a literal "<|endoftext|>" in a document never
// becomes an end-of-text id inside it. decode() is the inverse of encode() on the bytes: ids outside
// the vocabulary render as "<id>" (a model's padded vocabulary can sample them).
//
// Tokenizers are immutable after loading; their const methods are safe to call from several threads.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>
#include "models/data/deprecated_namespace.h"

namespace cpf::models::data {

enum class SpecialTokens {
  as_text,  // "<|endoftext|>" in the input is ordinary text (training data)
  parse,    // occurrences of the special tokens' text become their ids (prompts)
};

class Tokenizer {
 public:
  struct Special {
    std::string text;
    int64_t id;
  };

  virtual ~Tokenizer() = default;

  // How the tokenizer was named: "bytes", "gpt2" or the file it was loaded from.
  virtual std::string name() const = 0;
  // Every id encode() returns lies in [0, vocab_size()).
  virtual int64_t vocab_size() const = 0;
  // The id that ends a document (GPT-2's <|endoftext|> 50256).
  virtual int64_t eot_token() const = 0;
  // The special tokens; eot_token() is one of them.
  virtual const std::vector<Special>& special_tokens() const = 0;

  std::vector<int64_t> encode(std::string_view text, SpecialTokens specials = SpecialTokens::as_text) const;
  std::string decode(const std::vector<int64_t>& ids) const;

 protected:
  // Text without special tokens -> ids (appended to `out`).
  virtual void encode_ordinary(std::string_view text, std::vector<int64_t>& out) const = 0;
  // A run of ids none of which is special -> text; ids outside the vocabulary as "<id>".
  virtual std::string decode_ordinary(const std::vector<int64_t>& ids) const = 0;
};

// "bytes" | "gpt2" | a path ending in .json (Hugging Face) or .model (SentencePiece). Throws cpf::Error
// naming the spec and what is wrong (missing file, unsupported tokenizer kind, malformed file).
std::shared_ptr<const Tokenizer> load_tokenizer(const std::string& spec);

// The same names load_tokenizer accepts, for messages.
inline constexpr const char* kTokenizerChoices = "bytes | gpt2 | a tokenizer.json file | a SentencePiece .model file";

}  // namespace cpf::models::data
