#pragma once
// The dense bf16 tensor-core peak of the GPU a run trains on, the denominator of MFU (model FLOPs
// utilisation, models/model_flops.h), and its dense FP8 peak (twice as high on Ada, Hopper and Blackwell),
// the denominator of a run.precision: fp8 run's second MFU figure. Known from the device name for the GPUs
// in the table (apps/report/device_peak.cpp); CPF_PEAK_TFLOPS and CPF_PEAK_FP8_TFLOPS (TFLOP/s, e.g.
// 989.4 and 1978.9) set them for any other device, or override the table.
#include <optional>
#include <string>

#include "framework/tensor/device.h"

namespace cpf::trainer {

// FLOP/s of `device_name`'s dense bf16 peak from the table (no sparsity), or nullopt when unknown.
std::optional<double> dense_bf16_peak_from_name(const std::string& device_name);

// CPF_PEAK_TFLOPS when set (a positive number; anything else is an error naming it), else the table
// entry of `device`'s name; nullopt for the CPU and unknown GPUs.
std::optional<double> dense_bf16_peak(Device device);

// The same for FP8 (dense, no sparsity): nullopt also for a GPU without FP8 tensor cores (A100).
std::optional<double> dense_fp8_peak_from_name(const std::string& device_name);
std::optional<double> dense_fp8_peak(Device device);  // CPF_PEAK_FP8_TFLOPS overrides

}  // namespace cpf::trainer
