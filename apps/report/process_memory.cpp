#include "apps/report/process_memory.h"

#include <cstdio>
#include <fstream>
#include <sstream>

namespace cpf::trainer {
namespace {

std::optional<size_t> field_kib(const std::string& text, const std::string& name) {
  const size_t at = text.find("\n" + name + ":");
  const size_t start = text.rfind(name + ":", 0) == 0 ? 0 : (at == std::string::npos ? at : at + 1);
  if (start == std::string::npos) return std::nullopt;
  std::istringstream line(text.substr(start + name.size() + 1));
  size_t value = 0;
  std::string unit;
  if (!(line >> value >> unit) || unit != "kB") return std::nullopt;
  return value;
}

}  // namespace

std::optional<ResidentMemory> parse_proc_status_memory(const std::string& status_text) {
  const auto rss = field_kib(status_text, "VmRSS");
  if (!rss) return std::nullopt;
  const auto peak = field_kib(status_text, "VmHWM");
  return ResidentMemory{.current_bytes = *rss * 1024, .peak_bytes = (peak ? *peak : *rss) * 1024};
}

std::optional<ResidentMemory> resident_memory() {
  std::ifstream in("/proc/self/status");
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  return parse_proc_status_memory(text.str());
}

std::string format_memory(double bytes) {
  const double gib = bytes / 1073741824.0;  // MiB below 1 GiB, so small runs do not show 0.0
  char buf[32];
  if (gib >= 1.0) {
    std::snprintf(buf, sizeof buf, "%.1f GiB", gib);
  } else {
    std::snprintf(buf, sizeof buf, "%.0f MiB", gib * 1024.0);
  }
  return buf;
}

}  // namespace cpf::trainer
