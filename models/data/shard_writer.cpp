#include "models/data/shard_writer.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "framework/core/error.h"
#include "models/data/token_shards.h"

namespace cpf::models::data {
namespace {

constexpr size_t kBufferBytes = size_t{1} << 20;

std::string shard_name(const std::string& prefix, size_t index) {
  char digits[16];
  std::snprintf(digits, sizeof digits, "_%06zu.bin", index);
  return prefix + digits;
}

}  // namespace

ShardTokenType shard_token_type_for(int64_t vocab_size) {
  return vocab_size <= 65536 ? ShardTokenType::uint16 : ShardTokenType::uint32;
}

ShardTokenType parse_shard_token_type(const std::string& name) {
  if (name == "uint16") return ShardTokenType::uint16;
  if (name == "uint32") return ShardTokenType::uint32;
  CPF_FAIL("token type '", name, "' is not uint16 or uint32");
}

ShardWriter::ShardWriter(const ShardWriterOptions& options) : options_(options) {
  CPF_CHECK(!options.prefix.empty(), "shard writer: the output prefix is empty");
  CPF_CHECK(options.shard_tokens >= 1 && options.shard_tokens <= INT32_MAX,
            "shard writer: shard_tokens=", options.shard_tokens,
            " must lie in [1, 2^31 - 1] (the header counts tokens in an int32)");
  const int64_t limit = options.type == ShardTokenType::uint16 ? 65536 : kMaxShardVocabSize;
  CPF_CHECK(options.eot_token >= 0 && options.eot_token < limit, "shard writer: end-of-text id ", options.eot_token,
            " does not fit the token type");
  const std::filesystem::path folder = std::filesystem::path(options.prefix).parent_path();
  std::error_code ec;
  CPF_CHECK(folder.empty() || std::filesystem::is_directory(folder, ec), "shard writer: the output folder '",
            folder.string(), "' does not exist; create it first");
  buffer_.reserve(kBufferBytes);
}

ShardWriter::~ShardWriter() {
  if (file_) {
    std::fclose(file_);
    std::remove((path_ + ".tmp").c_str());
  }
}

void ShardWriter::write_bytes(const void* data, size_t size) {
  if (size > 0 && std::fwrite(data, 1, size, file_) != size) {
    CPF_FAIL("shard writer: cannot write '", path_, ".tmp' (", std::strerror(errno), ")");
  }
}

void ShardWriter::open_shard() {
  path_ = shard_name(options_.prefix, files_.size());
  file_ = std::fopen((path_ + ".tmp").c_str(), "wb");
  CPF_CHECK(file_, "shard writer: cannot create '", path_, ".tmp' (", std::strerror(errno), ")");
  const std::array<int32_t, kShardHeaderInts> placeholder{};  // rewritten with the count in close_shard
  write_bytes(placeholder.data(), kShardHeaderBytes);
  in_shard_ = 0;
}

void ShardWriter::close_shard() {
  write_bytes(buffer_.data(), buffer_.size());
  buffer_.clear();
  std::array<int32_t, kShardHeaderInts> header{};
  const bool wide = options_.type == ShardTokenType::uint32;
  header[0] = wide ? kShardMagicU32 : kShardMagic;
  header[1] = wide ? kShardVersionU32 : kShardVersion;
  header[2] = static_cast<int32_t>(in_shard_);
  CPF_CHECK(std::fseek(file_, 0, SEEK_SET) == 0, "shard writer: cannot seek in '", path_, ".tmp' (",
            std::strerror(errno), ")");
  write_bytes(header.data(), kShardHeaderBytes);
  const bool flushed = std::fflush(file_) == 0 && ::fsync(fileno(file_)) == 0;
  const int flush_errno = errno;
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  CPF_CHECK(flushed && closed, "shard writer: cannot complete '", path_, ".tmp' (", std::strerror(flush_errno), ")");
  std::error_code ec;
  std::filesystem::rename(path_ + ".tmp", path_, ec);
  CPF_CHECK(!ec, "shard writer: cannot rename '", path_, ".tmp' to '", path_, "' (", ec.message(), ")");
  files_.push_back(path_);
}

void ShardWriter::append(int64_t token) {
  if (!file_) open_shard();
  if (options_.type == ShardTokenType::uint16) {
    const auto v = static_cast<uint16_t>(token);
    buffer_.insert(buffer_.end(), reinterpret_cast<const unsigned char*>(&v),
                   reinterpret_cast<const unsigned char*>(&v) + 2);
  } else {
    const auto v = static_cast<uint32_t>(token);
    buffer_.insert(buffer_.end(), reinterpret_cast<const unsigned char*>(&v),
                   reinterpret_cast<const unsigned char*>(&v) + 4);
  }
  ++in_shard_;
  ++total_tokens_;
  if (buffer_.size() >= kBufferBytes) {
    write_bytes(buffer_.data(), buffer_.size());
    buffer_.clear();
  }
  if (in_shard_ == options_.shard_tokens) close_shard();
}

void ShardWriter::add_document(const std::vector<int64_t>& tokens) {
  const int64_t limit = options_.type == ShardTokenType::uint16 ? 65536 : kMaxShardVocabSize;
  for (int64_t t : tokens) {
    CPF_CHECK(t >= 0 && t < limit, "shard writer: token id ", t, " does not fit ",
              options_.type == ShardTokenType::uint16 ? "uint16 shards (ids below 65536); write uint32 shards"
                                                      : "uint32 shards (ids below 2^31)");
  }
  append(options_.eot_token);
  for (int64_t t : tokens) append(t);
}

std::vector<std::string> ShardWriter::finish() {
  if (file_) close_shard();
  return files_;
}

}  // namespace cpf::models::data
