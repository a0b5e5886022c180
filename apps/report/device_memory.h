#pragma once
// GPU memory figures for the trainer's log lines, from the CUDA backend's caching allocator
// (framework/tensor/cuda/cuda.h). A CPU device, or a build without the CUDA backend, has none.
#include <cstddef>
#include <optional>

#include "framework/tensor/device.h"

namespace cpf::trainer {

// Peak bytes handed out to tensors on `device` since the start or the last reset; nullopt for the CPU.
std::optional<size_t> peak_device_memory(Device device);
// Starts `device`'s peak afresh (a run's peak is its own, also the second run of a process); no-op on the CPU.
void reset_peak_device_memory(Device device);
// The whole memory of `device` (a GPU's total); nullopt for the CPU.
std::optional<size_t> total_device_memory(Device device);
}  // namespace cpf::trainer
