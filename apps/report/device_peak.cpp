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
  double tflops;               // NVIDIA's dense bf16 figure for the part
};

// PCIe parts before the SXM ones they share a name with.
constexpr PeakEntry kPeaks[] = {
    {"H100 PCIe", 756.0}, {"H100 NVL", 835.5}, {"H100", 989.4}, {"H200", 989.4}, {"H800", 989.4},
    {"B200", 2250.0},     {"A100", 312.0},     {"A800", 312.0}, {"L40S", 362.0}, {"L4", 121.0},
};

}  // namespace

std::optional<double> dense_bf16_peak_from_name(const std::string& device_name) {
  for (const PeakEntry& e : kPeaks) {
    if (device_name.find(e.name_part) != std::string::npos) return e.tflops * 1e12;
  }
  return std::nullopt;
}

std::optional<double> dense_bf16_peak(Device device) {
  if (const char* env = std::getenv("CPF_PEAK_TFLOPS"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    const double tflops = std::strtod(env, &end);
    CPF_CHECK(end != env && *end == '\0' && tflops > 0 && tflops < 1e6, "CPF_PEAK_TFLOPS='", env,
              "' must be the GPU's dense bf16 peak in TFLOP/s, a positive number (e.g. 989.4)");
    return tflops * 1e12;
  }
#if CPF_HAVE_CUDA
  if (device.is_cuda()) return dense_bf16_peak_from_name(cuda::device_name(device.index));
#endif
  (void)device;
  return std::nullopt;
}

}  // namespace cpf::trainer
