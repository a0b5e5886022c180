#include "models/data/token_shards.h"

#include <algorithm>
#include <array>
#include <bit>
#include <filesystem>

#include "framework/io/file_io.h"
#include "models/data/file_glob.h"

namespace cpf::models::data {

static_assert(std::endian::native == std::endian::little, "token shards are little-endian; this host is not");

namespace {

// Tokens read per pread while a shard is scanned for documents (2 MB).
constexpr int64_t kScanTokens = int64_t{1} << 20;

// The header of an open shard, validated against the size the file had when it was opened.
ShardHeader read_header(const io::FileReader& reader) {
  const std::string& path = reader.path();
  const auto size = static_cast<int64_t>(reader.size());
  CPF_CHECK(size >= kShardHeaderBytes, "token shard '", path, "': the file has ", size,
            " bytes, fewer than the 1024-byte header (truncated, or not an llm.c .bin shard)");
  std::array<int32_t, kShardHeaderInts> header{};
  reader.read_at(0, header.data(), kShardHeaderBytes);
  CPF_CHECK(header[0] == kShardMagic || header[0] == kShardMagicU32, "token shard '", path, "': magic number ",
            header[0], " is not ", kShardMagic, " (not an llm.c token shard); uint32 shards have ", kShardMagicU32);
  const bool wide = header[0] == kShardMagicU32;
  const int32_t version = wide ? kShardVersionU32 : kShardVersion;
  CPF_CHECK(header[1] == version, "token shard '", path, "': version ", header[1], " is not supported with magic ",
            header[0], " (expected ", version, ": ", wide ? "uint32" : "uint16", " tokens)");
  const int64_t count = header[2];
  const int64_t token_bytes = wide ? 4 : 2;
  CPF_CHECK(count >= 0, "token shard '", path, "': negative token count ", count, " in the header");
  const int64_t expected = kShardHeaderBytes + token_bytes * count;
  CPF_CHECK(size == expected, "token shard '", path, "': the header says ", count, " tokens, i.e. ", expected,
            " bytes, but the file has ", size, " bytes (", size < expected ? "truncated" : "trailing data", ")");
  return ShardHeader{count, token_bytes};
}

}  // namespace

// One shard, open for positioned reads. Not memory-mapped: a file truncated under a mapping kills the
// process with SIGBUS at the next touch of a lost page, while a short pread is an error naming it.
struct TokenShardSource::OpenShard {
  explicit OpenShard(const std::string& path) : reader(path) {}
  io::FileReader reader;
  int64_t count = 0;
  int64_t token_bytes = 2;

  // Tokens [begin, begin + n) into `out`; throws naming the file when it no longer holds them.
  void read(int64_t begin, int64_t n, std::vector<int64_t>& out) const {
    // A buffer per call: several DP ranks read one source at once.
    std::vector<unsigned char> raw(static_cast<size_t>(token_bytes * n));
    try {
      reader.read_at(static_cast<uint64_t>(kShardHeaderBytes + token_bytes * begin), raw.data(), raw.size());
    } catch (const Error& e) {
      CPF_FAIL("token shard '", reader.path(), "': cannot read tokens [", begin, ", ", begin + n, ") of the ", count,
               " its header announced (", e.message(), "); the file shrank while in use (truncated or rewritten)");
    }
    out.resize(static_cast<size_t>(n));
    if (token_bytes == 2) {
      const auto* ids = reinterpret_cast<const uint16_t*>(raw.data());
      std::copy(ids, ids + n, out.begin());
    } else {
      const auto* ids = reinterpret_cast<const uint32_t*>(raw.data());
      std::copy(ids, ids + n, out.begin());
    }
  }
};

ShardHeader read_shard_header(const std::string& path) {
  std::error_code ec;
  CPF_CHECK(std::filesystem::exists(path, ec), "token shard '", path, "' does not exist");
  const io::FileReader reader(path);
  return read_header(reader);
}

TokenShardSource::TokenShardSource(const ShardOptions& options) : options_(options) {
  CPF_CHECK(options.vocab_size >= 1 && options.vocab_size <= kMaxShardVocabSize,
            "token shards: vocab_size=", options.vocab_size, " must lie in [1, 2^31]");
  CPF_CHECK(options.eot_token >= 0 && options.eot_token < options.vocab_size,
            "token shards: eot_token=", options.eot_token, " is outside [0, vocab_size=", options.vocab_size, ")");
  files_ = expand_file_pattern(options.path, "token shards");
  std::vector<int64_t> chunk;
  for (const std::string& file : files_) {
    std::error_code ec;
    CPF_CHECK(std::filesystem::exists(file, ec), "token shard '", file, "' does not exist");
    auto shard = std::make_unique<OpenShard>(file);
    const ShardHeader header = read_header(shard->reader);
    shard->count = header.token_count;
    shard->token_bytes = header.token_bytes;
    // Documents: maximal runs between end-of-text tokens; every token is range-checked once here.
    const int64_t shard_id = static_cast<int64_t>(shards_.size());
    int64_t begin = 0;
    for (int64_t start = 0; start < shard->count; start += kScanTokens) {
      const int64_t n = std::min(kScanTokens, shard->count - start);
      shard->read(start, n, chunk);
      for (int64_t j = 0; j < n; ++j) {
        const int64_t i = start + j;
        const int64_t token = chunk[static_cast<size_t>(j)];
        CPF_CHECK(token < options.vocab_size, "token shard '", file, "': token ", token, " at index ", i,
                  " is not below vocab_size=", options.vocab_size);
        if (token == options.eot_token) {
          if (i > begin) documents_.push_back({shard_id, begin, i - begin});
          begin = i + 1;
        }
      }
    }
    if (shard->count > begin) documents_.push_back({shard_id, begin, shard->count - begin});
    total_tokens_ += shard->count;
    shards_.push_back(std::move(shard));
  }
  CPF_CHECK(!documents_.empty(), "token shards '", options.path, "': the ", files_.size(),
            " shard(s) hold no document (", total_tokens_, " tokens, all end-of-text ", options.eot_token, ")");
}

TokenShardSource::~TokenShardSource() = default;

int64_t TokenShardSource::document_length(int64_t index) const {
  check_document_index(*this, index);
  return documents_[static_cast<size_t>(index)].length;
}

Document TokenShardSource::document(int64_t index) const {
  check_document_index(*this, index);
  const DocumentSpan& span = documents_[static_cast<size_t>(index)];
  Document doc;
  shards_[static_cast<size_t>(span.shard)]->read(span.begin, span.length, doc.tokens);
  return doc;
}

std::string TokenShardSource::decode(const std::vector<int64_t>& tokens) const {
  if (options_.tokenizer) return options_.tokenizer->decode(tokens);
  std::string text;
  for (int64_t t : tokens) {
    if (t == options_.eot_token) {
      text += "<|endoftext|>";
    } else {
      append_token_id(text, t);
    }
  }
  return text;
}

}  // namespace cpf::models::data
