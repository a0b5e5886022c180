#pragma once
// train.log in the run folder: every line the console showed, each stamped with the UTC time and the
// rank that wrote it, so a batch job's log survives the terminal and lines can be timed afterwards:
//
//   2026-11-26T01:40:03.125Z [rank 0] step  200/1500 | loss 0.8123 | ...
//
// Nothing may be written to the run folder before a resume is accepted (resume_rules.h), so lines
// printed earlier (the banner, the model size) are kept in memory and written when open() is called.
// A resumed run appends: the log holds every session of the run.
#include <chrono>
#include <string>
#include <vector>

#include "apps/report/checked_file.h"

namespace cpf::trainer {

// "2026-11-26T01:40:03.125Z [rank 0] " + line.
std::string train_log_line(const std::string& line, int rank, std::chrono::system_clock::time_point when);

class TrainLog {
 public:
  TrainLog() = default;
  TrainLog(std::string path, int rank) : path_(std::move(path)), rank_(rank) {}

  // Opens the file for appending and writes the lines held so far. No-op without a path.
  void open();
  // Stamps `line` now; written at once when open, else held until open().
  void write(const std::string& line);

 private:
  std::string path_;
  int rank_ = 0;
  AppendOnlyFile file_;
  std::vector<std::string> pending_;  // stamped lines printed before open()
};

// Appends one stamped line (rank 0) to `path` when the file exists: the CLI's closing summary after
// the trainer closed its log. A missing file (the run wrote nothing) is left missing.
void append_train_log_line(const std::string& path, const std::string& line);

}  // namespace cpf::trainer
