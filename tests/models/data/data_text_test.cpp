#include <gtest/gtest.h>

#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <string>

#include "models/data/file_glob.h"
#include "models/data/text_source.h"
#include "support/test_utils.h"

namespace cpf::models::data {
namespace {
namespace fs = std::filesystem;

// A fresh directory per test, removed afterwards.
class TextSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("cpf_text_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& content) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << content;
    return path;
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::vector<std::string> texts(const TextSource& source) {
    std::vector<std::string> out;
    for (int64_t i = 0; i < source.num_documents(); ++i) out.push_back(source.document_text(i));
    return out;
  }
  fs::path dir_;
};

TEST(Glob, MatchesStarAndQuestionMark) {
  EXPECT_TRUE(glob_match("*.bin", "train_000.bin"));
  EXPECT_TRUE(glob_match("train_??.bin", "train_01.bin"));
  EXPECT_FALSE(glob_match("train_??.bin", "train_001.bin"));
  EXPECT_TRUE(glob_match("a*b*c", "aXXbYYc"));
  EXPECT_TRUE(glob_match("a*b*c", "abbbc"));
  EXPECT_FALSE(glob_match("a*b*c", "aXXbYY"));
  EXPECT_TRUE(glob_match("*", ""));
  EXPECT_FALSE(glob_match("?", ""));
  EXPECT_TRUE(glob_match("exact.txt", "exact.txt"));
  EXPECT_FALSE(glob_match("exact.txt", "exact.txt2"));
}

TEST_F(TextSourceTest, BlankLinesSeparateDocuments) {
  const std::string file = write("a.txt", "\n\nfirst line\nsecond line\n\n \t\nthird\n\n\nfourth\nfifth");
  const TextSource source({.path = file});
  EXPECT_EQ(texts(source), (std::vector<std::string>{"first line\nsecond line", "third", "fourth\nfifth"}));
  const Document doc = source.document(1);
  EXPECT_EQ(doc.tokens, (std::vector<int64_t>{'t', 'h', 'i', 'r', 'd'}));
  EXPECT_EQ(doc.prompt_length, 0);
  EXPECT_EQ(source.document_length(0), 22);
  EXPECT_EQ(source.vocab_size(), 257);
  EXPECT_EQ(source.eot_token(), 256);
  EXPECT_EQ(source.decode({'h', 'i', 256, 300}), "hi<|endoftext|><300>");
}

TEST_F(TextSourceTest, BytesAboveAsciiAreTokensBelow256) {
  const std::string file = write("u.txt", "caf\xc3\xa9");
  const TextSource source({.path = file, .split = TextSplit::file});
  EXPECT_EQ(source.document(0).tokens, (std::vector<int64_t>{'c', 'a', 'f', 0xc3, 0xa9}));
}

TEST_F(TextSourceTest, SeparatorAndWholeFileModes) {
  const std::string file = write("s.txt", "one\n---\ntwo\n\nstill two---\n---three");
  const TextSource by_sep({.path = file, .split = TextSplit::separator, .separator = "---"});
  EXPECT_EQ(texts(by_sep), (std::vector<std::string>{"one\n", "\ntwo\n\nstill two", "three"}));
  const TextSource whole({.path = file, .split = TextSplit::file});
  EXPECT_EQ(texts(whole), (std::vector<std::string>{"one\n---\ntwo\n\nstill two---\n---three"}));
}

TEST_F(TextSourceTest, PatternsReadEveryMatchingFileInSortedOrder) {
  write("part_2.txt", "two");
  write("part_1.txt", "one\n\nuno");
  write("other.md", "not matched");
  const TextSource source({.path = path("part_?.txt")});
  EXPECT_EQ(source.files(), (std::vector<std::string>{path("part_1.txt"), path("part_2.txt")}));
  EXPECT_EQ(texts(source), (std::vector<std::string>{"one", "uno", "two"}));
  const TextSource per_file({.path = path("*.txt"), .split = TextSplit::file});
  EXPECT_EQ(texts(per_file), (std::vector<std::string>{"one\n\nuno", "two"}));
}

TEST_F(TextSourceTest, MissingEmptyAndBlankFilesAreErrorsNamingThePath) {
  EXPECT_CPF_ERROR(TextSource({.path = path("nope.txt")}),
                   "text source: file '" + path("nope.txt") + "' does not exist");
  const std::string empty = write("empty.txt", "");
  EXPECT_CPF_ERROR(TextSource({.path = empty}), "text source: file '" + empty + "' is empty");
  const std::string blank = write("blank.txt", "\n  \n\t\n");
  EXPECT_CPF_ERROR(TextSource({.path = blank}), "file '" + blank + "' holds no document (text_split: blank_lines");
  EXPECT_CPF_ERROR(TextSource({.path = blank, .split = TextSplit::file}), "holds no document (text_split: file");
  // One bad file among good ones still fails, naming the bad one.
  write("ok.txt", "fine");
  EXPECT_CPF_ERROR(TextSource({.path = path("*.txt")}), "file '" + blank + "' holds no document");
  EXPECT_CPF_ERROR(TextSource({.path = dir_.string()}), "is not a regular file");
}

TEST_F(TextSourceTest, PatternErrorsNameThePattern) {
  EXPECT_CPF_ERROR(TextSource({.path = path("*.none")}),
                   "text source: pattern '" + path("*.none") + "' matches no file");
  EXPECT_CPF_ERROR(
      TextSource({.path = path("missing_dir/*.txt")}),
      "directory '" + path("missing_dir") + "' of pattern '" + path("missing_dir/*.txt") + "' does not exist");
  EXPECT_CPF_ERROR(TextSource({.path = path("d*/a.txt")}), "wildcards are only supported in the file name");
  EXPECT_CPF_ERROR(TextSource({.path = ""}), "text source: the path is empty");
}

TEST_F(TextSourceTest, RejectsBadSplitOptions) {
  const std::string file = write("a.txt", "x");
  EXPECT_CPF_ERROR(TextSource({.path = file, .split = TextSplit::separator}),
                   "text_split is 'separator' but text_separator is empty");
  EXPECT_CPF_ERROR(parse_text_split("lines"),
                   "unknown text_split 'lines' (text_split: blank_lines | separator | file)");
  const TextSource source({.path = file});
  EXPECT_CPF_ERROR(source.document(1), "text: document index 1 is outside [0, 1)");
}

}  // namespace
}  // namespace cpf::models::data
