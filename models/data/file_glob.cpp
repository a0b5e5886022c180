#include "models/data/file_glob.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "framework/core/error.h"

namespace cpf::models::data {
namespace fs = std::filesystem;

bool glob_match(std::string_view pattern, std::string_view name) {
  // Iterative matcher: on a mismatch, retry from the last '*' with it swallowing one more character.
  size_t p = 0, n = 0;
  size_t star = std::string_view::npos, star_n = 0;
  while (n < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++p;
      ++n;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      star_n = n;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      n = ++star_n;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

std::vector<std::string> expand_file_pattern(const std::string& pattern, const std::string& what) {
  CPF_CHECK(!pattern.empty(), what, ": the path is empty (set `path` to a file or a pattern like data/*.bin)");
  const fs::path path(pattern);
  const std::string name = path.filename().string();
  const std::string dir = path.parent_path().string();
  CPF_CHECK(dir.find_first_of("*?") == std::string::npos, what,
            ": wildcards are only supported in the file name, not in the directory part of '", pattern, "'");
  std::error_code ec;
  if (name.find_first_of("*?") == std::string::npos) {
    CPF_CHECK(fs::exists(path, ec), what, ": file '", pattern, "' does not exist");
    CPF_CHECK(fs::is_regular_file(path, ec), what, ": '", pattern, "' is not a regular file");
    return {pattern};
  }
  const fs::path directory = dir.empty() ? fs::path(".") : fs::path(dir);
  CPF_CHECK(fs::is_directory(directory, ec), what, ": directory '", directory.string(), "' of pattern '", pattern,
            "' does not exist");
  std::vector<std::string> files;
  for (const fs::directory_entry& entry : fs::directory_iterator(directory, ec)) {
    if (!entry.is_regular_file(ec)) continue;
    const std::string entry_name = entry.path().filename().string();
    if (glob_match(name, entry_name)) files.push_back((fs::path(dir) / entry_name).string());
  }
  CPF_CHECK(!ec, what, ": cannot list directory '", directory.string(), "' of pattern '", pattern, "': ", ec.message());
  CPF_CHECK(!files.empty(), what, ": pattern '", pattern, "' matches no file");
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace cpf::models::data
