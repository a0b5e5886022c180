#include "framework/core/logging.h"

#include <atomic>
#include <cctype>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <set>
#include <utility>

namespace cpf {
namespace {

LogLevel level_from_env() {
  const char* value = std::getenv("CPF_LOG_LEVEL");
  if (value == nullptr || *value == '\0') return LogLevel::info;
  std::string text(value);
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (text == "debug") return LogLevel::debug;
  if (text == "info") return LogLevel::info;
  if (text == "warn" || text == "warning") return LogLevel::warn;
  if (text == "error") return LogLevel::error;
  // A typo should not silently change what gets logged.
  std::cerr << "[cpformer warn] CPF_LOG_LEVEL='" << value << "' is not one of debug, info, warn, error; using info\n";
  return LogLevel::info;
}

std::atomic<LogLevel>& level_storage() {
  static std::atomic<LogLevel> level{level_from_env()};
  return level;
}

const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::debug: return "debug";
    case LogLevel::info: return "info";
    case LogLevel::warn: return "warn";
    case LogLevel::error: return "error";
  }
  return "?";
}

}  // namespace

LogLevel log_level() { return level_storage().load(); }
void set_log_level(LogLevel level) { level_storage().store(level); }

bool first_time_seen(const std::string& topic, const std::string& key) {
  static std::mutex mutex;
  static std::set<std::pair<std::string, std::string>> seen;
  std::lock_guard<std::mutex> lock(mutex);
  return seen.emplace(topic, key).second;
}

void log_message(LogLevel level, const std::string& message) {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  std::cerr << "[cpformer " << level_name(level) << "] " << message << '\n';
}

}  // namespace cpf
