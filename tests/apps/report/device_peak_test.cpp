// The GPU peak tables behind MFU (bf16 and FP8) and their CPF_PEAK_TFLOPS / CPF_PEAK_FP8_TFLOPS overrides
// (apps/report/device_peak.h).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "apps/report/device_peak.h"
#include "framework/core/error.h"

namespace cpf::trainer {
namespace {

class PeakEnv : public ::testing::Test {
 protected:
  void TearDown() override {
    unsetenv("CPF_PEAK_TFLOPS");
    unsetenv("CPF_PEAK_FP8_TFLOPS");
  }
};

TEST(DevicePeak, KnownNamesAndPcieBeforeSxm) {
  EXPECT_DOUBLE_EQ(*dense_bf16_peak_from_name("NVIDIA H100 80GB HBM3"), 989.4e12);
  EXPECT_DOUBLE_EQ(*dense_bf16_peak_from_name("NVIDIA H100 PCIe"), 756.0e12);
  EXPECT_DOUBLE_EQ(*dense_bf16_peak_from_name("NVIDIA H200"), 989.4e12);
  EXPECT_DOUBLE_EQ(*dense_bf16_peak_from_name("NVIDIA A100-SXM4-80GB"), 312.0e12);
  EXPECT_FALSE(dense_bf16_peak_from_name("NVIDIA GeForce GTX 1080").has_value());
  EXPECT_FALSE(dense_bf16_peak_from_name("").has_value());
}

TEST(DevicePeak, Fp8IsTwiceBf16WhereTheGpuHasFp8TensorCores) {
  EXPECT_DOUBLE_EQ(*dense_fp8_peak_from_name("NVIDIA H100 80GB HBM3"), 1978.9e12);
  EXPECT_DOUBLE_EQ(*dense_fp8_peak_from_name("NVIDIA H200"), 1978.9e12);
  EXPECT_DOUBLE_EQ(*dense_fp8_peak_from_name("NVIDIA H100 PCIe"), 1513.0e12);
  EXPECT_DOUBLE_EQ(*dense_fp8_peak_from_name("NVIDIA L4"), 242.5e12);
  EXPECT_FALSE(dense_fp8_peak_from_name("NVIDIA A100-SXM4-80GB").has_value());  // no FP8 tensor cores
  EXPECT_FALSE(dense_fp8_peak_from_name("NVIDIA GeForce GTX 1080").has_value());
}

TEST_F(PeakEnv, TheFp8OverrideIsItsOwn) {
  setenv("CPF_PEAK_TFLOPS", "100", 1);
  EXPECT_FALSE(dense_fp8_peak(Device::cpu()).has_value());
  setenv("CPF_PEAK_FP8_TFLOPS", "250.5", 1);
  EXPECT_DOUBLE_EQ(*dense_fp8_peak(Device::cpu()), 250.5e12);
  setenv("CPF_PEAK_FP8_TFLOPS", "lots", 1);
  try {
    (void)dense_fp8_peak(Device::cpu());
    ADD_FAILURE() << "CPF_PEAK_FP8_TFLOPS=lots was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CPF_PEAK_FP8_TFLOPS='lots' must be the GPU's dense FP8 peak in TFLOP/s"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(PeakEnv, TheCpuHasNoPeakUnlessTheEnvironmentGivesOne) {
  unsetenv("CPF_PEAK_TFLOPS");
  EXPECT_FALSE(dense_bf16_peak(Device::cpu()).has_value());
  setenv("CPF_PEAK_TFLOPS", "123.5", 1);
  EXPECT_DOUBLE_EQ(*dense_bf16_peak(Device::cpu()), 123.5e12);
}

TEST_F(PeakEnv, ABadOverrideIsRefusedByName) {
  for (const char* bad : {"fast", "-3", "0", "12x", "1e9"}) {
    setenv("CPF_PEAK_TFLOPS", bad, 1);
    try {
      (void)dense_bf16_peak(Device::cpu());
      ADD_FAILURE() << "CPF_PEAK_TFLOPS=" << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(
          std::string(e.what()).find(std::string("CPF_PEAK_TFLOPS='") + bad + "' must be the GPU's dense bf16 peak"),
          std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace cpf::trainer
