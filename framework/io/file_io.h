#pragma once
// Small POSIX file helpers for formats that must be durable: writes that can be fsync'd (files and
// the folders that name them) and positioned reads. Every failure throws naming the path and the
// system's reason.
#include <cstddef>
#include <cstdint>
#include <string>

namespace cpf::io {

// A file opened for writing (created or truncated). Close it explicitly: the destructor closes
// without reporting errors, which is only right on an error path.
class FileWriter {
 public:
  explicit FileWriter(const std::string& path);
  ~FileWriter();
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;

  void write(const void* data, size_t nbytes);
  // Flushes the file's data and size to the disk (fsync).
  void sync();
  void close();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

// A file opened for reading with its size known up front.
class FileReader {
 public:
  explicit FileReader(const std::string& path);
  ~FileReader();
  FileReader(const FileReader&) = delete;
  FileReader& operator=(const FileReader&) = delete;

  uint64_t size() const { return size_; }
  // Reads exactly nbytes at `offset`; throws if the file ends first.
  void read_at(uint64_t offset, void* data, size_t nbytes) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// Writes `contents` to `path`, optionally fsync'd.
void write_file(const std::string& path, const std::string& contents, bool sync);
std::string read_file(const std::string& path);
// fsync on a folder: makes the names created or renamed inside it durable.
void sync_directory(const std::string& path);

}  // namespace cpf::io
