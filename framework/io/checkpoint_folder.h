#pragma once
// The folder side of checkpoints (framework/io/checkpoint.h, sharded_checkpoint.h): step_* names,
// the temporary folder a save writes into, the atomic publish, leftovers of interrupted saves and the
// rotation. Internal to framework/io: the two writers share it.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace cpf::io {

inline constexpr const char* kCheckpointTempPrefix = ".tmp-";
inline constexpr const char* kCheckpointOldPrefix = ".old-";

// "step_" followed by 8 to 18 digits: the step; -1 for any other name.
int64_t parse_step_dir(const std::string& name);
// Throw cpf::Error (not filesystem_error) naming the path.
uint64_t size_of(const std::filesystem::path& path);
void remove_tree(const std::filesystem::path& path);
void rename_path(const std::filesystem::path& from, const std::filesystem::path& to);
std::vector<std::filesystem::directory_entry> list_dir(const std::filesystem::path& dir);
// Moves `tmp` to `final_path`, replacing an existing one atomically where the filesystem allows.
void publish(const std::filesystem::path& tmp, const std::filesystem::path& final_path);
// Removes the .tmp-step_* and .old-step_* folders interrupted saves left in `dir`.
void remove_leftovers(const std::filesystem::path& dir);
// Keeps the newest keep_last - 1 checkpoints other than `name` and deletes the rest, oldest first.
void remove_older_checkpoints(const std::string& dir, const std::string& name, int keep_last);

}  // namespace cpf::io
