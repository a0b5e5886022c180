#include "models/data/token_shards.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "models/data/file_glob.h"

namespace cpf::data {

static_assert(std::endian::native == std::endian::little, "token shards are little-endian; this host is not");

// A read-only mapping of one shard's token area.
struct TokenShardSource::MappedShard {
  void* mapping = nullptr;
  size_t mapped_bytes = 0;
  const uint16_t* tokens = nullptr;
  int64_t count = 0;

  ~MappedShard() {
    if (mapping != nullptr) munmap(mapping, mapped_bytes);
  }
};

ShardHeader read_shard_header(const std::string& path) {
  std::error_code ec;
  CPF_CHECK(std::filesystem::exists(path, ec), "token shard '", path, "' does not exist");
  const auto size = static_cast<int64_t>(std::filesystem::file_size(path, ec));
  CPF_CHECK(!ec, "token shard '", path, "': cannot read its size: ", ec.message());
  CPF_CHECK(size >= kShardHeaderBytes, "token shard '", path, "': the file has ", size,
            " bytes, fewer than the 1024-byte header (truncated, or not an llm.c .bin shard)");
  std::array<int32_t, kShardHeaderInts> header{};
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(header.data()), kShardHeaderBytes);
  CPF_CHECK(in.gcount() == kShardHeaderBytes, "token shard '", path, "': cannot read the 1024-byte header");
  CPF_CHECK(header[0] == kShardMagic, "token shard '", path, "': magic number ", header[0], " is not ", kShardMagic,
            " (not an llm.c token shard)");
  CPF_CHECK(header[1] == kShardVersion, "token shard '", path, "': version ", header[1], " is not supported (only ",
            kShardVersion, ": uint16 tokens)");
  const int64_t count = header[2];
  CPF_CHECK(count >= 0, "token shard '", path, "': negative token count ", count, " in the header");
  const int64_t expected = kShardHeaderBytes + 2 * count;
  CPF_CHECK(size == expected, "token shard '", path, "': the header says ", count, " tokens, i.e. ", expected,
            " bytes, but the file has ", size, " bytes (", size < expected ? "truncated" : "trailing data", ")");
  return ShardHeader{count};
}

TokenShardSource::TokenShardSource(const ShardOptions& options) : options_(options) {
  CPF_CHECK(options.vocab_size >= 1 && options.vocab_size <= 65536, "token shards: vocab_size=", options.vocab_size,
            " must lie in [1, 65536] (tokens are uint16)");
  CPF_CHECK(options.eot_token >= 0 && options.eot_token < options.vocab_size, "token shards: eot_token=",
            options.eot_token, " is outside [0, vocab_size=", options.vocab_size, ")");
  files_ = expand_file_pattern(options.path, "token shards");
  for (const std::string& file : files_) {
    const ShardHeader header = read_shard_header(file);
    auto shard = std::make_unique<MappedShard>();
    shard->count = header.token_count;
    if (header.token_count > 0) {
      const int fd = ::open(file.c_str(), O_RDONLY);
      CPF_CHECK(fd >= 0, "token shard '", file, "': cannot open: ", std::strerror(errno));
      shard->mapped_bytes = static_cast<size_t>(kShardHeaderBytes + 2 * header.token_count);
      shard->mapping = ::mmap(nullptr, shard->mapped_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
      const int map_errno = errno;
      ::close(fd);
      if (shard->mapping == MAP_FAILED) {
        shard->mapping = nullptr;
        CPF_FAIL("token shard '", file, "': mmap failed: ", std::strerror(map_errno));
      }
      shard->tokens = reinterpret_cast<const uint16_t*>(static_cast<const char*>(shard->mapping) + kShardHeaderBytes);
    }
    // Documents: maximal runs between end-of-text tokens; every token is range-checked once here.
    const int64_t shard_id = static_cast<int64_t>(shards_.size());
    int64_t begin = 0;
    for (int64_t i = 0; i <= shard->count; ++i) {
      const bool at_end = i == shard->count;
      const int64_t token = at_end ? options.eot_token : shard->tokens[i];
      CPF_CHECK(token < options.vocab_size, "token shard '", file, "': token ", token, " at index ", i,
                " is not below vocab_size=", options.vocab_size);
      if (token == options.eot_token) {
        if (i > begin) documents_.push_back({shard_id, begin, i - begin});
        begin = i + 1;
      }
    }
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
  const uint16_t* tokens = shards_[static_cast<size_t>(span.shard)]->tokens + span.begin;
  Document doc;
  doc.tokens.assign(tokens, tokens + span.length);
  return doc;
}

std::string TokenShardSource::decode(const std::vector<int64_t>& tokens) const {
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

}  // namespace cpf::data
