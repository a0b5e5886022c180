#pragma once
// Minimal leveled logging to stderr. CPF_LOG_LEVEL=debug|info|warn|error sets the threshold.
#include <string>

#include "framework/core/error.h"

namespace cpf {

enum class LogLevel { debug = 0, info = 1, warn = 2, error = 3 };

LogLevel log_level();
void set_log_level(LogLevel level);
void log_message(LogLevel level, const std::string& message);
// True the first time this process asks about `key` under `topic` (thread-safe): for a line logged
// once per configuration rather than at every step, e.g. the attention backend each shape gets.
bool first_time_seen(const std::string& topic, const std::string& key);

template <class... Args>
void log(LogLevel level, const Args&... args) {
  if (level >= log_level()) log_message(level, str_cat(args...));
}
template <class... Args>
void log_info(const Args&... args) {
  log(LogLevel::info, args...);
}
template <class... Args>
void log_warn(const Args&... args) {
  log(LogLevel::warn, args...);
}
template <class... Args>
void log_debug(const Args&... args) {
  log(LogLevel::debug, args...);
}

}  // namespace cpf
