#pragma once
// Where a tensor's storage lives: the host ("cpu") or a CUDA device ("cuda:N").
#include <cstdint>
#include <ostream>
#include <string>

namespace cpf {

enum class DeviceType : uint8_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;  // CUDA ordinal; always 0 for cpu

  constexpr Device() = default;
  constexpr Device(DeviceType t, int i = 0) : type(t), index(t == DeviceType::cpu ? 0 : i) {}
  // Parses "cpu", "cuda" (= cuda:0) or "cuda:N".
  static Device parse(const std::string& text);
  static constexpr Device cpu() { return Device(DeviceType::cpu, 0); }
  static constexpr Device cuda(int index = 0) { return Device(DeviceType::cuda, index); }

  bool is_cpu() const { return type == DeviceType::cpu; }
  bool is_cuda() const { return type == DeviceType::cuda; }
  std::string str() const;
  friend bool operator==(const Device&, const Device&) = default;
};

std::ostream& operator<<(std::ostream& os, const Device& device);

}  // namespace cpf
