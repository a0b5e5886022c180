#include "apps/report/device_peak.h"

#include <cstdlib>
#include <string_view>

#include "framework/core/error.h"

#if CPF_HAVE_CUDA
#include "framework/tensor/cuda/cuda.h"
#endif

namespace cpf::trainer {
namespace {

struct PeakEntry {
  std::string_view name_part;  // matched against the device name; the first match wins
  double bf16_tflops;          // NVIDIA's dense bf16 figure for the part
  double fp8_tflops;           // its dense FP8 figure; 0: no FP8 tensor cores
};

// PCIe parts before the SXM ones they share a name with.
constexpr PeakEntry kPeaks[] = {
    {"H100 PCIe", 756.0, 1513.0}, {"H100 NVL", 835.5, 1670.5}, {"H100", 989.4, 1978.9}, {"H200", 989.4, 1978.9},
    {"H800", 989.4, 1978.9},      {"B200", 2250.0, 4500.0},    {"A100", 312.0, 0.0},    {"A800", 312.0, 0.0},
    {"L40S", 362.0, 733.0},       {"L4", 121.0, 242.5},
};

std::optional<double> peak_from_name(const std::string& device_name, double PeakEntry::*field) {
  for (const PeakEntry& e : kPeaks) {
    if (device_name.find(e.name_part) == std::string::npos) continue;
    return e.*field > 0 ? std::optional<double>(e.*field * 1e12) : std::nullopt;
  }
  return std::nullopt;
}

// `variable` (TFLOP/s) when set, else the table's `field` for `device`'s name.
std::optional<double> device_peak(Device device, const char* variable, double PeakEntry::*field, const char* what,
                                  const char* example) {
  if (const char* env = std::getenv(variable); env != nullptr && *env != '\0') {
    char* end = nullptr;
    const double tflops = std::strtod(env, &end);
    CPF_CHECK(end != env && *end == '\0' && tflops > 0 && tflops < 1e6, variable, "='", env, "' must be the GPU's ",
              what, " in TFLOP/s, a positive number (e.g. ", example, ")");
    return tflops * 1e12;
  }
#if CPF_HAVE_CUDA
  if (device.is_cuda()) return peak_from_name(cuda::device_name(device.index), field);
#endif
  (void)device;
  (void)field;
  return std::nullopt;
}

}  // namespace

std::optional<double> dense_bf16_peak_from_name(const std::string& device_name) {
  return peak_from_name(device_name, &PeakEntry::bf16_tflops);
}

std::optional<double> dense_fp8_peak_from_name(const std::string& device_name) {
  return peak_from_name(device_name, &PeakEntry::fp8_tflops);
}

std::optional<double> dense_bf16_peak(Device device) {
  return device_peak(device, "CPF_PEAK_TFLOPS", &PeakEntry::bf16_tflops, "dense bf16 peak", "989.4");
}

std::optional<double> dense_fp8_peak(Device device) {
  return device_peak(device, "CPF_PEAK_FP8_TFLOPS", &PeakEntry::fp8_tflops, "dense FP8 peak", "1978.9");
}

}  // namespace cpf::trainer
