#pragma once
// The trainer process's resident memory (RSS) for CPU runs' log lines, which show it where GPU runs
// show the device allocator's peak (device_memory.h). Linux: /proc/self/status.
#include <cstddef>
#include <optional>
#include <string>

namespace cpf::trainer {

struct ResidentMemory {
  size_t current_bytes = 0;  // VmRSS
  size_t peak_bytes = 0;     // VmHWM: the high-water mark since the process started
};

// nullopt where /proc/self/status is not readable (not Linux, a restricted sandbox).
std::optional<ResidentMemory> resident_memory();

// Parses the VmRSS / VmHWM lines ("VmRSS:     123456 kB") of a /proc/<pid>/status text.
std::optional<ResidentMemory> parse_proc_status_memory(const std::string& status_text);

// "512 MiB" below 1 GiB, "1.5 GiB" above (one rule for every memory figure of the log).
std::string format_memory(double bytes);

}  // namespace cpf::trainer
