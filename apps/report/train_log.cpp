#include "apps/report/train_log.h"

#include <cstdio>
#include <ctime>
#include <filesystem>

namespace cpf::trainer {

std::string train_log_line(const std::string& line, int rank, std::chrono::system_clock::time_point when) {
  const auto since_epoch = when.time_since_epoch();
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(since_epoch);
  const auto millis = std::chrono::duration_cast<std::chrono::milliseconds>(since_epoch - seconds).count();
  const std::time_t t = static_cast<std::time_t>(seconds.count());
  std::tm utc{};
  gmtime_r(&t, &utc);
  char stamp[64];
  std::snprintf(stamp, sizeof stamp, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ [rank %d] ", utc.tm_year + 1900,
                utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec, static_cast<int>(millis), rank);
  return stamp + line;
}

void TrainLog::open() {
  if (path_.empty() || file_.is_open()) return;
  file_ = AppendOnlyFile(path_);
  for (const auto& line : pending_) file_.append_line(line);
  pending_.clear();
}

void TrainLog::write(const std::string& line) {
  if (path_.empty()) return;
  std::string stamped = train_log_line(line, rank_, std::chrono::system_clock::now());
  if (file_.is_open()) {
    file_.append_line(stamped);
  } else {
    pending_.push_back(std::move(stamped));
  }
}

void append_train_log_line(const std::string& path, const std::string& line) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return;
  AppendOnlyFile(path).append_line(train_log_line(line, 0, std::chrono::system_clock::now()));
}

}  // namespace cpf::trainer
