#include "framework/io/checkpoint_folder.h"

#include <fcntl.h>

#include <algorithm>
#include <cstdio>

#include "framework/core/error.h"
#include "framework/core/logging.h"
#include "framework/io/checkpoint.h"
#include "framework/io/file_io.h"

namespace cpf::io {

namespace fs = std::filesystem;

// "step_" followed by at least 8 digits; the step, or -1 for any other name.
int64_t parse_step_dir(const std::string& name) {
  if (name.rfind("step_", 0) != 0) return -1;
  const std::string digits = name.substr(5);
  if (digits.size() < 8 || digits.size() > 18) return -1;
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) return -1;
  return std::stoll(digits);
}

uint64_t size_of(const fs::path& path) {
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  CPF_CHECK(!ec, "cannot read the size of ", path.string(), ": ", ec.message());
  return size;
}

void remove_tree(const fs::path& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  CPF_CHECK(!ec, "cannot remove ", path.string(), ": ", ec.message());
}

void rename_path(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::rename(from, to, ec);
  CPF_CHECK(!ec, "cannot rename ", from.string(), " to ", to.string(), ": ", ec.message());
}

// The entries of a folder; throws cpf::Error (not filesystem_error) when it cannot be read.
std::vector<fs::directory_entry> list_dir(const fs::path& dir) {
  std::error_code ec;
  std::vector<fs::directory_entry> out;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) out.push_back(*it);
  CPF_CHECK(!ec, "cannot list ", dir.string(), ": ", ec.message());
  return out;
}

// Moves `tmp` to `final`, replacing an existing `final` atomically where the filesystem allows.
void publish(const fs::path& tmp, const fs::path& final_path) {
  if (!fs::exists(final_path)) {
    rename_path(tmp, final_path);
    return;
  }
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_path.c_str(), RENAME_EXCHANGE) == 0) {
    remove_tree(tmp);  // now holds the replaced checkpoint
    return;
  }
  // No atomic exchange here: move the old one aside first (a crash between the renames loses only
  // this step's older copy; earlier checkpoints stay valid).
  const fs::path old = final_path.parent_path() / (kCheckpointOldPrefix + final_path.filename().string());
  remove_tree(old);
  rename_path(final_path, old);
  rename_path(tmp, final_path);
  remove_tree(old);
}

void remove_leftovers(const fs::path& dir) {
  for (const auto& entry : list_dir(dir)) {
    const std::string name = entry.path().filename().string();
    for (const char* prefix : {kCheckpointTempPrefix, kCheckpointOldPrefix}) {
      if (name.rfind(prefix, 0) == 0 && parse_step_dir(name.substr(std::string(prefix).size())) >= 0) {
        log_warn("checkpoint: removing ", entry.path().string(), " left by an interrupted save");
        remove_tree(entry.path());
      }
    }
  }
}

// Keeps the newest keep_last - 1 checkpoints other than `name` and deletes the rest, oldest first.
// Renaming before removing means a crash mid-delete never leaves a half-deleted step_* folder.
void remove_older_checkpoints(const std::string& dir, const std::string& name, int keep_last) {
  std::vector<std::string> others;
  for (const std::string& path : list_checkpoints(dir)) {
    if (fs::path(path).filename() != name) others.push_back(path);
  }
  const size_t keep_others = static_cast<size_t>(keep_last - 1);
  const size_t remove_count = others.size() > keep_others ? others.size() - keep_others : 0;
  for (size_t i = 0; i < remove_count; ++i) {
    const fs::path victim(others[i]);
    const fs::path aside = victim.parent_path() / (kCheckpointOldPrefix + victim.filename().string());
    rename_path(victim, aside);
    remove_tree(aside);
  }
  if (remove_count > 0) sync_directory(dir);
}

std::string checkpoint_dir_name(int64_t step) {
  CPF_CHECK(step >= 0, "checkpoint: step must be >= 0, got ", step);
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step_%08lld", static_cast<long long>(step));
  return buf;
}

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return {};
  for (const auto& entry : list_dir(dir)) {
    const int64_t step = parse_step_dir(entry.path().filename().string());
    if (step >= 0 && entry.is_directory()) found.emplace_back(step, entry.path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& [step, path] : found) out.push_back(std::move(path));
  return out;
}

}  // namespace cpf::io
