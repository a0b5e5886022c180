#pragma once
// Hugging Face `tokenizer.json` files of the byte-level BPE kind (GPT-2, GPT-J/NeoX, Llama 3, Qwen,
// most models trained with `tokenizers`' ByteLevelBPETokenizer):
//   model          {"type": "BPE", "vocab": {...}, "merges": ["a b", ...] or [["a", "b"], ...],
//                   "ignore_merges": bool}; dropout, byte_fallback, a continuing_subword_prefix or an
//                   end_of_word_suffix are refused (not byte-level BPE)
//   normalizer     null, or NFC (GPT-NeoX, Pythia); other normalizers are refused
//   pre_tokenizer  {"type": "ByteLevel", "use_regex": true} (GPT-2's pattern), or a Sequence of
//                  {"type": "Split", "pattern": {"Regex": ...}, "behavior": "Isolated", "invert": false}
//                  and {"type": "ByteLevel", "use_regex": false} (Llama 3); add_prefix_space is honoured
//   added_tokens   become the special tokens; the end-of-text token is the first of <|endoftext|>,
//                  <|end_of_text|>, </s>, <eos>, <|im_end|> that is present
// Merges follow the merges list (BpeMergeRule::merge_list), as `tokenizers` does. Anything else is
// refused with a message naming the field, never guessed.
// The post_processor (e.g. Llama 3's <|begin_of_text|> before every text) and the decoder are not
// applied: documents are written with cpformer's end-of-text between them, and decode returns bytes.
#include <memory>
#include <string>

#include "models/data/deprecated_namespace.h"
#include "models/data/tokenizer.h"

namespace cpf::models::data {

std::shared_ptr<const Tokenizer> load_hf_tokenizer_json(const std::string& path);

}  // namespace cpf::models::data
