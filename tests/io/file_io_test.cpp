#include <gtest/gtest.h>

#include <unistd.h>
#include <filesystem>

#include "framework/io/file_io.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

namespace fs = std::filesystem;

class FileIo : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("cpf_file_io_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(FileIo, WritesSyncsAndReadsBack) {
  const std::string path = (dir_ / "a.bin").string();
  std::string payload(100000, '\0');
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>(i * 31 % 251);
  {
    io::FileWriter writer(path);
    writer.write(payload.data(), 10);
    writer.write(payload.data() + 10, payload.size() - 10);
    writer.sync();
    writer.close();
    writer.close();  // a second close is a no-op
  }
  EXPECT_EQ(io::read_file(path), payload);
  io::FileReader reader(path);
  EXPECT_EQ(reader.size(), payload.size());
  char middle[5];
  reader.read_at(500, middle, 5);
  EXPECT_EQ(std::string(middle, 5), payload.substr(500, 5));
  io::write_file(path, "short", true);  // truncates
  EXPECT_EQ(io::read_file(path), "short");
  io::sync_directory(dir_.string());
}

TEST_F(FileIo, ReportsErrorsWithPathAndReason) {
  const std::string path = (dir_ / "b.bin").string();
  io::write_file(path, "abcd", false);
  io::FileReader reader(path);
  char buf[4];
  EXPECT_CPF_ERROR(reader.read_at(2, buf, 4), path + ": unexpected end of file at byte 4 (2 more bytes expected)");
  io::FileWriter writer(path);
  writer.close();
  EXPECT_CPF_ERROR(writer.write("x", 1), "write to " + path + " after close");
  EXPECT_CPF_ERROR(writer.sync(), "sync of " + path + " after close");
  EXPECT_CPF_ERROR(io::read_file((dir_ / "missing").string()),
                   "cannot open " + (dir_ / "missing").string() + ": No such file");
  EXPECT_CPF_ERROR(io::FileReader(dir_.string()), "cannot read " + dir_.string() + ": not a regular file");
  EXPECT_CPF_ERROR(io::FileWriter((dir_ / "no/such").string()), "cannot create " + (dir_ / "no/such").string());
  EXPECT_CPF_ERROR(io::sync_directory((dir_ / "none").string()), "cannot open folder " + (dir_ / "none").string());
}

}  // namespace
}  // namespace cpf
