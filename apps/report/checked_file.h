#pragma once
// Writes to the run folder that fail loudly. A full disk or a read-only folder must stop the run at
// the first write with the path and the OS error, not leave 0-byte files behind while training goes
// on (std::ofstream reports neither which call failed nor why).
#include <cstdint>
#include <string>

namespace cpf::trainer {

// Replaces `path` with `text`: written to `<path>.tmp`, flushed to disk, then renamed over `path`, so
// a failure leaves the previous file intact. Throws cpf::Error naming the path and the OS error.
void write_file_atomically(const std::string& path, const std::string& text);

// A file opened for appending whole lines (metrics.jsonl); every write is checked.
class AppendOnlyFile {
 public:
  AppendOnlyFile() = default;
  explicit AppendOnlyFile(const std::string& path);  // creates it if missing; throws naming the OS error
  ~AppendOnlyFile();
  AppendOnlyFile(AppendOnlyFile&& other) noexcept;
  AppendOnlyFile& operator=(AppendOnlyFile&& other) noexcept;
  AppendOnlyFile(const AppendOnlyFile&) = delete;
  AppendOnlyFile& operator=(const AppendOnlyFile&) = delete;

  bool is_open() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }
  // Appends `line` and a newline with one write; throws naming the path and the OS error.
  void append_line(const std::string& line);

 private:
  int fd_ = -1;
  std::string path_;
};

// Writes all of `data` to `fd` (retrying short writes and EINTR); returns 0 or the errno of the failure.
int write_all(int fd, const char* data, size_t size);

}  // namespace cpf::trainer
