#pragma once
// The dense bf16 tensor-core peak of the GPU a run trains on, the denominator of MFU (model FLOPs
// utilisation, models/model_flops.h). Known from the device name for the GPUs in the table below;
// CPF_PEAK_TFLOPS (TFLOP/s, e.g. 989.4) sets it for any other device, or overrides the table.
#include <optional>
#include <string>

#include "framework/tensor/device.h"

namespace cpf::trainer {

// FLOP/s of `device_name`'s dense bf16 peak from the table (no sparsity), or nullopt when unknown.
std::optional<double> dense_bf16_peak_from_name(const std::string& device_name);

// CPF_PEAK_TFLOPS when set (a positive number; anything else is an error naming it), else the table
// entry of `device`'s name; nullopt for the CPU and unknown GPUs.
std::optional<double> dense_bf16_peak(Device device);

}  // namespace cpf::trainer
