#include "framework/tensor/device_ops.h"

#include <array>
#include <atomic>

namespace cpf {
namespace {

// Function-local so that device libraries may register from their static initialisers, whatever the
// order in which translation units are initialised.
std::array<std::atomic<const DeviceOps*>, 2>& tables() {
  static std::array<std::atomic<const DeviceOps*>, 2> table{};
  return table;
}

}  // namespace

void register_device_ops(DeviceType type, const DeviceOps* ops) {
  tables()[static_cast<size_t>(type)].store(ops, std::memory_order_release);
}

const DeviceOps* find_device_ops(DeviceType type) {
  return tables()[static_cast<size_t>(type)].load(std::memory_order_acquire);
}

}  // namespace cpf
