#pragma once
// CPF_SYNC_CHECK=1: a line per training step naming the host synchronisations the CUDA backend made
// during it (cuda::host_sync_counts(), framework/tensor/cuda/cuda.h), to find what still makes the host
// wait inside a step. The counts are process-wide: with rank threads sharing a process, a step's line
// holds every rank's synchronisations of that interval.
#include <cstdint>
#include <optional>
#include <string>

#include "framework/tensor/device.h"

namespace cpf::trainer {

class SyncCheck {
 public:
  // Reads the counts now when the check is on and `device` is a GPU; otherwise does nothing.
  explicit SyncCheck(Device device);
  // "step N: host synchronisations 2 (device->host copies 2, ...)" for the interval since construction,
  // or nullopt when the check is off.
  std::optional<std::string> line(int64_t step) const;

 private:
  bool on_ = false;
  uint64_t counts_[5] = {};
};

}  // namespace cpf::trainer
