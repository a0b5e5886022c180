#pragma once
// The run folder's lifecycle outside the training loop: one trainer at a time (an exclusive flock),
// the start-over modes of run.resume, and metrics.jsonl made consistent with the step a run starts at.
//
//   <run folder>/.lock        holds the PID of the trainer that has the folder; flock()ed while it runs
//
// The lock is advisory and per open file, so it also separates two trainers in one process. It is
// released by the kernel when the process ends, however it ends; the file is left in place (removing
// it could let a third trainer lock a new file while the second still holds the old one).
#include <cstdint>
#include <optional>
#include <string>

#include "apps/config/config.h"

namespace cpf::trainer {

class RunFolderLock {
 public:
  // Creates `dir` if needed and locks it. Throws cpf::Error naming the PID of the trainer that holds
  // it (and the fix) when another trainer has it.
  explicit RunFolderLock(const std::string& dir);
  ~RunFolderLock();
  RunFolderLock(const RunFolderLock&) = delete;
  RunFolderLock& operator=(const RunFolderLock&) = delete;

  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

// Applies run.resume before anything is trained or written (the caller holds the lock):
//   never:   refuses a folder that holds checkpoints (a later automatic resume would continue them),
//   replace: deletes the folder's checkpoints and metrics.jsonl,
//   auto:    nothing here (the ranks decide after validating the checkpoints).
void apply_start_mode(const TrainConfig& config);

// Before step 1: creates checkpoints/ and writes and removes a probe with the longest path a checkpoint
// writes there, so a folder that cannot take checkpoints (read-only, not a folder, a path too long for
// the file system) is refused before any training work instead of at the first checkpoint.
void check_checkpoints_writable(const TrainConfig& config);

// Before step 1: a warning when the run folder's file system has less free space than the checkpoints the
// run keeps at once (weights and optimizer state, about (1 + moments) x the parameters' bytes each; up to
// run.keep_checkpoints + 1 while a new one replaces the oldest), naming both sizes and the fixes; nullopt
// when they fit or the sizes are unknown. `available`: the free bytes (tests), else asked of the system.
std::optional<std::string> checkpoint_space_warning(const TrainConfig& config,
                                                    std::optional<uint64_t> available = std::nullopt);

}  // namespace cpf::trainer
