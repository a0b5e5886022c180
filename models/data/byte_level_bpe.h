#pragma once
// Byte-level BPE: the tokenizer of GPT-2, GPT-3 (r50k), Llama 3 and most Hugging Face "ByteLevel"
// models. Text (bytes) is cut into pieces by a regex (bpe_pretokenizer.h); each piece starts as its
// single bytes and adjacent parts are merged, lowest rank first (leftmost on ties), until no pair
// merges. Every byte is a token, so any input encodes and decode(encode(x)) == x byte for byte.
//
// Two merge rules, because the two reference implementations differ on rare pieces:
//   token_rank  tiktoken: a pair merges when its concatenation is a token; rank = that token's id
//   merge_list  Hugging Face: a pair merges when it is in the merges list; rank = its place there
//
// Vocabulary files write tokens in the printable "byte-level" alphabet (GPT-2's bytes_to_unicode:
// byte 0x20 is "Ġ"); the spec holds raw bytes (byte_level_to_bytes converts).
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "models/data/bpe_pretokenizer.h"
#include "models/data/deprecated_namespace.h"
#include "models/data/tokenizer.h"

namespace cpf::models::data {

enum class BpeMergeRule { token_rank, merge_list };

struct ByteLevelBpeSpec {
  std::string name;                                         // for messages: "gpt2" or the file
  std::vector<std::pair<std::string, int64_t>> vocab;       // raw token bytes -> id (all 256 bytes included)
  std::vector<std::pair<std::string, std::string>> merges;  // merge_list: raw byte pairs, first = highest priority
  BpeMergeRule rule = BpeMergeRule::token_rank;
  bool whole_piece_first = true;  // a piece that is a token is that token (tiktoken; HF ignore_merges)
  std::string pattern = kGpt2Pattern;
  bool add_prefix_space = false;  // HF ByteLevel: a text not starting with a space gets one
  bool nfc = false;               // HF normalizer NFC: text is NFC-normalized first
  std::vector<Tokenizer::Special> specials;
  int64_t eot_token = -1;  // one of the specials' ids
};

// "Ġhello" -> " hello". Throws naming `where` and the token when a character is outside the alphabet.
std::string byte_level_to_bytes(std::string_view printable, const std::string& where);
// The inverse, for writing vocabulary files.
std::string bytes_to_byte_level(std::string_view bytes);

class ByteLevelBpe : public Tokenizer {
 public:
  // Validates the spec (every byte a token, ids unique and dense enough, merges of known tokens,
  // eot among the specials) and throws naming spec.name and the offending entry.
  explicit ByteLevelBpe(ByteLevelBpeSpec spec);

  std::string name() const override { return name_; }
  int64_t vocab_size() const override { return static_cast<int64_t>(id_to_bytes_.size()); }
  int64_t eot_token() const override { return eot_; }
  const std::vector<Special>& special_tokens() const override { return specials_; }

 protected:
  void encode_ordinary(std::string_view text, std::vector<int64_t>& out) const override;
  std::string decode_ordinary(const std::vector<int64_t>& ids) const override;

 private:
  // Rank of merging parts a and b into one (lower merges first), or -1 when they do not merge.
  int64_t merge_rank(std::string_view a, std::string_view b) const;
  void encode_piece(std::string_view piece, std::vector<int64_t>& out) const;
  int64_t token_id(std::string_view bytes) const;

  std::string name_;
  BpeMergeRule rule_;
  bool whole_piece_first_;
  bool add_prefix_space_;
  bool nfc_;
  BpePreTokenizer pretokenizer_;
  std::unordered_map<std::string, int64_t> bytes_to_id_;
  std::vector<std::string> id_to_bytes_;  // "" for ids that no token uses
  std::vector<bool> id_used_;
  std::unordered_map<std::string, int64_t> merge_ranks_;  // merge_list: key(a, b) -> place
  std::vector<Special> specials_;
  int64_t eot_ = -1;

  // Pieces repeat (" the"): their ids are cached. Bounded; cleared when full.
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int64_t>> cache_;
};

}  // namespace cpf::models::data
