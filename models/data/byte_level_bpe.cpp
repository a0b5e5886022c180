#include "models/data/byte_level_bpe.h"

#include <algorithm>
#include <array>
#include <queue>

#include "framework/core/error.h"
#include "models/data/document_source.h"

namespace cpf::models::data {
namespace {

constexpr size_t kMaxCachedPieces = size_t{1} << 20;

// GPT-2's bytes_to_unicode: printable bytes stand for themselves, the other 68 map to U+0100 onwards.
const std::array<char32_t, 256>& byte_to_codepoint() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    const auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; };
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) t[static_cast<size_t>(b)] = printable(b) ? static_cast<char32_t>(b) : next++;
    return t;
  }();
  return table;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Key of the pair (a, b) in merge_ranks_: a's length first, so ("ab", "c") and ("a", "bc") differ.
std::string pair_key(std::string_view a, std::string_view b) {
  std::string key;
  key.reserve(a.size() + b.size() + 4);
  const auto n = static_cast<uint32_t>(a.size());
  key.append(reinterpret_cast<const char*>(&n), sizeof n);
  key.append(a);
  key.append(b);
  return key;
}

}  // namespace

std::string byte_level_to_bytes(std::string_view printable, const std::string& where) {
  static const std::unordered_map<char32_t, char> inverse = [] {
    std::unordered_map<char32_t, char> m;
    for (int b = 0; b < 256; ++b) m[byte_to_codepoint()[static_cast<size_t>(b)]] = static_cast<char>(b);
    return m;
  }();
  std::string out;
  for (size_t i = 0; i < printable.size();) {
    const auto b0 = static_cast<unsigned char>(printable[i]);
    char32_t cp = b0;
    size_t length = 1;
    if (b0 >= 0xC0 && b0 < 0xE0 && i + 1 < printable.size()) {
      cp = ((b0 & 0x1F) << 6) | (static_cast<unsigned char>(printable[i + 1]) & 0x3F), length = 2;
    } else if (b0 >= 0xE0 && b0 < 0xF0 && i + 2 < printable.size()) {
      cp = ((b0 & 0x0F) << 12) | ((static_cast<unsigned char>(printable[i + 1]) & 0x3F) << 6) |
           (static_cast<unsigned char>(printable[i + 2]) & 0x3F),
      length = 3;
    }
    const auto it = inverse.find(cp);
    CPF_CHECK(b0 < 0x80 || b0 >= 0xC0, where, ": token '", std::string(printable), "' is not valid UTF-8");
    CPF_CHECK(it != inverse.end(), where, ": token '", std::string(printable), "' has the character U+", std::hex,
              static_cast<uint32_t>(cp), std::dec,
              " outside the byte-level alphabet (not a byte-level BPE vocabulary?)");
    out += it->second;
    i += length;
  }
  return out;
}

std::string bytes_to_byte_level(std::string_view bytes) {
  std::string out;
  for (unsigned char b : bytes) append_utf8(out, byte_to_codepoint()[b]);
  return out;
}

ByteLevelBpe::ByteLevelBpe(ByteLevelBpeSpec spec)
    : name_(spec.name),
      rule_(spec.rule),
      whole_piece_first_(spec.whole_piece_first),
      add_prefix_space_(spec.add_prefix_space),
      nfc_(spec.nfc),
      pretokenizer_(spec.pattern),
      specials_(std::move(spec.specials)),
      eot_(spec.eot_token) {
  int64_t size = 0;
  for (const auto& [bytes, id] : spec.vocab) {
    CPF_CHECK(id >= 0 && id < (int64_t{1} << 31), name_, ": token id ", id, " of '", bytes_to_byte_level(bytes),
              "' is outside [0, 2^31)");
    CPF_CHECK(!bytes.empty(), name_, ": token id ", id, " is the empty string");
    CPF_CHECK(bytes_to_id_.emplace(bytes, id).second, name_, ": token '", bytes_to_byte_level(bytes),
              "' appears twice in the vocabulary");
    size = std::max(size, id + 1);
  }
  for (const Special& s : specials_) size = std::max(size, s.id + 1);
  id_to_bytes_.assign(static_cast<size_t>(size), "");
  id_used_.assign(static_cast<size_t>(size), false);
  for (const auto& [bytes, id] : spec.vocab) {
    CPF_CHECK(!id_used_[static_cast<size_t>(id)], name_, ": token id ", id, " is used by two tokens ('",
              bytes_to_byte_level(id_to_bytes_[static_cast<size_t>(id)]), "' and '", bytes_to_byte_level(bytes), "')");
    id_to_bytes_[static_cast<size_t>(id)] = bytes;
    id_used_[static_cast<size_t>(id)] = true;
  }
  for (int b = 0; b < 256; ++b) {
    CPF_CHECK(bytes_to_id_.count(std::string(1, static_cast<char>(b))), name_,
              ": the vocabulary has no token for byte ", b, " ('",
              bytes_to_byte_level(std::string(1, static_cast<char>(b))), "'); byte-level BPE needs all 256 bytes");
  }
  for (size_t i = 0; i < spec.merges.size() && rule_ == BpeMergeRule::merge_list; ++i) {
    const auto& [a, b] = spec.merges[i];
    CPF_CHECK(bytes_to_id_.count(a + b), name_, ": merge ", i, " ('", bytes_to_byte_level(a), "' '",
              bytes_to_byte_level(b), "') makes '", bytes_to_byte_level(a + b), "', which is not in the vocabulary");
    merge_ranks_.emplace(pair_key(a, b), static_cast<int64_t>(i));  // a repeated merge keeps its first place
  }
  const bool eot_found =
      std::any_of(specials_.begin(), specials_.end(), [&](const Special& s) { return s.id == eot_; });
  CPF_CHECK(eot_found, name_, ": the end-of-text id ", eot_, " is not one of the special tokens");
}

int64_t ByteLevelBpe::token_id(std::string_view bytes) const {
  const auto it = bytes_to_id_.find(std::string(bytes));
  return it == bytes_to_id_.end() ? -1 : it->second;
}

int64_t ByteLevelBpe::merge_rank(std::string_view a, std::string_view b) const {
  if (rule_ == BpeMergeRule::token_rank) {
    std::string joined(a);
    joined += b;
    return token_id(joined);
  }
  const auto it = merge_ranks_.find(pair_key(a, b));
  return it == merge_ranks_.end() ? -1 : it->second;
}

// Lowest rank first, leftmost on ties, with a heap so a long piece costs O(n log n) rather than O(n^2).
void ByteLevelBpe::encode_piece(std::string_view piece, std::vector<int64_t>& out) const {
  if (whole_piece_first_ || piece.size() == 1) {
    if (const int64_t id = token_id(piece); id >= 0) {
      out.push_back(id);
      return;
    }
  }
  struct Part {
    size_t begin, end;
    int64_t prev, next;
    bool alive = true;
  };
  std::vector<Part> parts;
  parts.reserve(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) {
    parts.push_back({i, i + 1, static_cast<int64_t>(i) - 1, i + 1 < piece.size() ? static_cast<int64_t>(i) + 1 : -1});
  }
  struct Candidate {
    int64_t rank;
    size_t left;
    size_t left_end, right_end;  // the pair as it was when queued
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  const auto text = [&](const Part& p) { return piece.substr(p.begin, p.end - p.begin); };
  const auto push = [&](int64_t left) {
    if (left < 0 || parts[static_cast<size_t>(left)].next < 0) return;
    const Part& l = parts[static_cast<size_t>(left)];
    const Part& r = parts[static_cast<size_t>(l.next)];
    const int64_t rank = merge_rank(text(l), text(r));
    if (rank >= 0) queue.push({rank, static_cast<size_t>(left), l.end, r.end});
  };
  for (size_t i = 0; i + 1 < parts.size(); ++i) push(static_cast<int64_t>(i));
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Part& l = parts[c.left];
    if (!l.alive || l.end != c.left_end || l.next < 0 || parts[static_cast<size_t>(l.next)].end != c.right_end) {
      continue;  // stale: one side merged since it was queued
    }
    Part& r = parts[static_cast<size_t>(l.next)];
    l.end = r.end;
    l.next = r.next;
    r.alive = false;
    if (l.next >= 0) parts[static_cast<size_t>(l.next)].prev = static_cast<int64_t>(c.left);
    push(l.prev);
    push(static_cast<int64_t>(c.left));
  }
  for (const Part& p : parts) {
    if (!p.alive) continue;
    const int64_t id = token_id(text(p));
    CPF_CHECK(id >= 0, name_, ": BPE ended on '", bytes_to_byte_level(text(p)), "', which is not a token");
    out.push_back(id);
  }
}

void ByteLevelBpe::encode_ordinary(std::string_view text, std::vector<int64_t>& out) const {
  std::string normalized;
  if (nfc_) {
    normalized = nfc_normalize(text);
    text = normalized;
  }
  std::string prefixed;
  if (add_prefix_space_ && !text.empty() && text.front() != ' ') {
    prefixed.reserve(text.size() + 1);
    prefixed.push_back(' ');
    prefixed.append(text);
    text = prefixed;
  }
  for (std::string_view piece : pretokenizer_.split(text)) {
    std::string key(piece);
    {
      std::lock_guard<std::mutex> lock(cache_mutex_);
      if (const auto it = cache_.find(key); it != cache_.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        continue;
      }
    }
    std::vector<int64_t> ids;
    encode_piece(piece, ids);
    out.insert(out.end(), ids.begin(), ids.end());
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() >= kMaxCachedPieces) cache_.clear();
    cache_.emplace(std::move(key), std::move(ids));
  }
}

std::string ByteLevelBpe::decode_ordinary(const std::vector<int64_t>& ids) const {
  std::string text;
  for (int64_t id : ids) {
    if (id >= 0 && id < vocab_size() && id_used_[static_cast<size_t>(id)]) {
      text += id_to_bytes_[static_cast<size_t>(id)];
    } else {
      append_token_id(text, id);
    }
  }
  return text;
}

}  // namespace cpf::models::data
