#include "attention/attention_backend.h"

#include <array>
#include <mutex>
#include <string>
#include <utility>

#include "framework/core/error.h"

namespace cpf {
namespace {

constexpr std::array<std::pair<std::string_view, AttentionBackend>, 3> kBackends{{
    {"auto", AttentionBackend::automatic},
    {"cudnn", AttentionBackend::cudnn},
    {"unfused", AttentionBackend::unfused},
}};

// One slot per device type; written by static initialisers, read by every call.
std::array<raw::DeviceAttentionKernels, 2>& registry() {
  static std::array<raw::DeviceAttentionKernels, 2> kernels{};
  return kernels;
}
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

}  // namespace

std::string_view attention_backend_name(AttentionBackend backend) {
  for (const auto& [name, b] : kBackends) {
    if (b == backend) return name;
  }
  CPF_FAIL("attention backend: unknown value ", static_cast<int>(backend));
}

AttentionBackend parse_attention_backend(std::string_view name) {
  std::string valid;
  for (const auto& [n, b] : kBackends) {
    if (n == name) return b;
    valid += (valid.empty() ? "" : ", ") + std::string(n);
  }
  CPF_FAIL("unknown attention backend '", std::string(name), "' (valid: ", valid, ")");
}

namespace raw {

void register_device_attention(DeviceType type, const DeviceAttentionKernels& kernels) {
  CPF_CHECK(kernels.forward && kernels.backward, "register_device_attention: forward and backward must both be set");
  std::lock_guard lock(registry_mutex());
  registry()[static_cast<size_t>(type)] = kernels;
}

const DeviceAttentionKernels* device_attention(DeviceType type) {
  std::lock_guard lock(registry_mutex());
  const DeviceAttentionKernels& k = registry()[static_cast<size_t>(type)];
  return k.forward ? &k : nullptr;
}

}  // namespace raw
}  // namespace cpf
