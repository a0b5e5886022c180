#include "framework/io/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "framework/core/error.h"

namespace cpf::io {
namespace {

std::string reason() { return std::strerror(errno); }

}  // namespace

FileWriter::FileWriter(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  CPF_CHECK(fd_ >= 0, "cannot create ", path, ": ", reason());
}

FileWriter::~FileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void FileWriter::write(const void* data, size_t nbytes) {
  CPF_CHECK(fd_ >= 0, "write to ", path_, " after close");
  const char* p = static_cast<const char*>(data);
  while (nbytes > 0) {
    const ssize_t n = ::write(fd_, p, nbytes);
    if (n < 0 && errno == EINTR) continue;
    CPF_CHECK(n > 0, "cannot write ", path_, ": ", n < 0 ? reason() : std::string("no progress"));
    p += n;
    nbytes -= static_cast<size_t>(n);
  }
}

void FileWriter::sync() {
  CPF_CHECK(fd_ >= 0, "sync of ", path_, " after close");
  CPF_CHECK(::fsync(fd_) == 0, "cannot sync ", path_, ": ", reason());
}

void FileWriter::close() {
  if (fd_ < 0) return;
  const int fd = fd_;
  fd_ = -1;
  CPF_CHECK(::close(fd) == 0, "cannot close ", path_, ": ", reason());
}

FileReader::FileReader(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  CPF_CHECK(fd_ >= 0, "cannot open ", path, ": ", reason());
  struct stat st {};
  std::string why;
  if (::fstat(fd_, &st) != 0) {
    why = reason();
  } else if (!S_ISREG(st.st_mode)) {
    why = "not a regular file";
  }
  if (!why.empty()) {
    ::close(fd_);
    fd_ = -1;
    CPF_FAIL("cannot read ", path, ": ", why);
  }
  size_ = static_cast<uint64_t>(st.st_size);
}

FileReader::~FileReader() {
  if (fd_ >= 0) ::close(fd_);
}

void FileReader::read_at(uint64_t offset, void* data, size_t nbytes) const {
  char* p = static_cast<char*>(data);
  while (nbytes > 0) {
    const ssize_t n = ::pread(fd_, p, nbytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    CPF_CHECK(n >= 0, "cannot read ", path_, ": ", reason());
    CPF_CHECK(n > 0, path_, ": unexpected end of file at byte ", offset, " (", nbytes, " more bytes expected)");
    p += n;
    offset += static_cast<uint64_t>(n);
    nbytes -= static_cast<size_t>(n);
  }
}

void write_file(const std::string& path, const std::string& contents, bool sync) {
  FileWriter writer(path);
  writer.write(contents.data(), contents.size());
  if (sync) writer.sync();
  writer.close();
}

std::string read_file(const std::string& path) {
  FileReader reader(path);
  std::string contents(reader.size(), '\0');
  reader.read_at(0, contents.data(), contents.size());
  return contents;
}

void sync_directory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  CPF_CHECK(fd >= 0, "cannot open folder ", path, ": ", reason());
  const int rc = ::fsync(fd);
  const std::string why = rc == 0 ? std::string() : reason();
  ::close(fd);
  CPF_CHECK(rc == 0, "cannot sync folder ", path, ": ", why);
}

}  // namespace cpf::io
