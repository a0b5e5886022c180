// DeviceGraph (framework/tensor/device_graph.h) where no graph can be captured: the CPU is refused with
// its reason before the body runs, and an empty graph refuses to replay. The GPU behaviour is
// tests/tensor/cuda/device_graph_test.cpp.
#include <gtest/gtest.h>

#include "framework/tensor/device_graph.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

TEST(DeviceGraphRefusals, TheCpuCannotCaptureAndTheBodyDoesNotRun) {
  EXPECT_FALSE(DeviceGraph::supported(Device::cpu()));
  bool ran = false;
  EXPECT_CPF_ERROR((void)DeviceGraph::capture(Device::cpu(), [&] { ran = true; }),
                   "DeviceGraph::capture: cpu cannot capture graphs (CUDA devices only");
  EXPECT_FALSE(ran);
}

TEST(DeviceGraphRefusals, AnEmptyBodyOrGraphIsRefused) {
  EXPECT_CPF_ERROR((void)DeviceGraph::capture(Device::cpu(), nullptr), "DeviceGraph::capture: no body to capture");
  const DeviceGraph none;
  EXPECT_FALSE(none.defined());
  EXPECT_CPF_ERROR(none.replay(), "DeviceGraph::replay: no graph was captured");
}

}  // namespace
}  // namespace cpf
