#pragma once
// Device-parameterised tests: the devices a suite runs on, a fixture that skips a device this machine
// lacks (saying why), and shorthands that build a test's inputs on the device under test.
//
//   class MyOpTest : public cpf::testing::DeviceTest {};
//   TEST_P(MyOpTest, Values) { Tensor x = grad_leaf({3, 4}, 1); ... }
//   CPF_INSTANTIATE_DEVICE_SUITE(MyOpTest);
//
// gives MyOpTest.Values/cpu always and MyOpTest.Values/cuda0 in builds that link the CUDA backend; the
// cuda0 instantiation skips with its reason on machines without a GPU (CI), so a new op cannot land
// CPU-only without a test that fails on the GPU machine (docs/contributing.md).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/views.h"
#include "framework/tensor/storage.h"
#include "support/test_utils.h"

namespace cpf::testing {

// cpu, plus cuda:0 when the build has a CUDA backend registered (cpf_tensor_cuda linked), visible GPU or
// not. Fake backends (support/host_as_device.h) are registered by tests only after this list is read.
inline std::vector<Device> test_devices() {
  std::vector<Device> devices{Device::cpu()};
  if (has_device_backend(DeviceType::cuda)) devices.push_back(Device::cuda(0));
  return devices;
}

// The non-CPU devices of test_devices(): what device-versus-CPU comparisons run on.
inline std::vector<Device> accelerator_devices() {
  std::vector<Device> devices;
  for (const Device& d : test_devices()) {
    if (!d.is_cpu()) devices.push_back(d);
  }
  return devices;
}

// Why `device` cannot run tests on this machine, or "" when it can.
inline std::string device_unavailable_reason(Device device) {
  if (device.is_cpu()) return "";
  if (!has_device_backend(device.type)) return "this build has no backend for " + device.str();
  const int count = device_backend(device.type).device_count();
  if (device.index < count) return "";
  return "no " + device.str() + " is visible (device_count() == " + std::to_string(count) +
         "): the device-parameterised suites run on the GPU machines (docs/contributing.md)";
}

// Test-name suffix for a device: "cpu", "cuda0".
inline std::string device_test_name(Device device) {
  return device.is_cpu() ? "cpu" : "cuda" + std::to_string(device.index);
}
inline std::string device_param_name(const ::testing::TestParamInfo<Device>& info) {
  return device_test_name(info.param);
}

// A random tensor of `dtype` on `device`: drawn in f64 on the host and rounded once, so every device
// gets bit-identical inputs for a seed.
inline Tensor random_on(Device device, const Shape& shape, DType dtype, uint64_t seed, double low = -1.0,
                        double high = 1.0) {
  return raw::to(raw::to(random_tensor(shape, DType::f64, seed, low, high), dtype), device);
}

// Base of device-parameterised suites: GetParam() is the device; SetUp skips unavailable ones.
class DeviceTest : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override {
    const std::string reason = device_unavailable_reason(GetParam());
    if (!reason.empty()) GTEST_SKIP() << reason;
  }
  Device device() const { return GetParam(); }
  // A copy of `t` (any dtype, e.g. indices or masks built on the host) on the device under test.
  Tensor on_device(const Tensor& t) const { return raw::to(t, device()); }
  // An f64 leaf requiring grad on the device, uniform in [low, high): the gradcheck input.
  Tensor grad_leaf(const Shape& shape, uint64_t seed, double low = -1.0, double high = 1.0) const {
    Tensor t = random_on(device(), shape, DType::f64, seed, low, high);
    t.set_requires_grad(true);
    return t;
  }
  // The same values as a (rows, cols) leaf, seen through non-unit strides: the transpose of a
  // contiguous (cols, rows) tensor on the device, so the op reads a strided view.
  Tensor strided_leaf(int64_t rows, int64_t cols, uint64_t seed) const {
    Tensor t = raw::transpose(random_on(device(), {cols, rows}, DType::f64, seed), 0, 1);
    t.set_requires_grad(true);
    return t;
  }
  // An f64 constant (no grad) on the device.
  Tensor constant(const Shape& shape, uint64_t seed, double low = -1.0, double high = 1.0) const {
    return random_on(device(), shape, DType::f64, seed, low, high);
  }
};

}  // namespace cpf::testing

// Instantiates a DeviceTest suite over test_devices(): names end in /cpu and /cuda0.
#define CPF_INSTANTIATE_DEVICE_SUITE(suite)                                              \
  INSTANTIATE_TEST_SUITE_P(, suite, ::testing::ValuesIn(::cpf::testing::test_devices()), \
                           ::cpf::testing::device_param_name)
