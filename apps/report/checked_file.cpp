#include "apps/report/checked_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "framework/core/error.h"

namespace cpf::trainer {

int write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EIO;  // no progress and no error: do not spin
    data += n;
    size -= static_cast<size_t>(n);
  }
  return 0;
}

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  CPF_CHECK(fd >= 0, "cannot write ", tmp, ": ", std::strerror(errno));
  int err = write_all(fd, text.data(), text.size());
  // The data must be on disk before the rename makes it the file (a crash must not leave it empty).
  if (err == 0 && ::fsync(fd) != 0 && errno != EINVAL && errno != EROFS) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err != 0) {
    std::remove(tmp.c_str());
    CPF_FAIL("cannot write ", path, " (via ", tmp, "): ", std::strerror(err));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    err = errno;
    std::remove(tmp.c_str());
    CPF_FAIL("cannot write ", path, ": renaming ", tmp, " over it failed: ", std::strerror(err));
  }
}

AppendOnlyFile::AppendOnlyFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  CPF_CHECK(fd_ >= 0, "cannot open ", path, " for writing: ", std::strerror(errno));
}

AppendOnlyFile::~AppendOnlyFile() {
  if (fd_ >= 0) ::close(fd_);
}

AppendOnlyFile::AppendOnlyFile(AppendOnlyFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)) {}

AppendOnlyFile& AppendOnlyFile::operator=(AppendOnlyFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
  }
  return *this;
}

void AppendOnlyFile::append_line(const std::string& line) {
  CPF_CHECK(fd_ >= 0, "AppendOnlyFile: ", path_.empty() ? "(no file)" : path_, " is not open");
  const std::string text = line + '\n';
  const int err = write_all(fd_, text.data(), text.size());
  CPF_CHECK(err == 0, "cannot write ", path_, ": ", std::strerror(err));
}

}  // namespace cpf::trainer
