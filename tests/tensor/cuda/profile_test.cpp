// cpf::profile on a GPU: the CUDA backend's hooks time a scope with events on the current stream
// (read at snapshot, not at scope end), and a side stream made current is the one timed.
#include "framework/tensor/profile.h"

#include <gtest/gtest.h>

#include "cuda_test_utils.h"
#include "framework/tensor/device_stream.h"
#include "framework/tensor/ops/matmul.h"

namespace cpf {
namespace {

class CudaProfile : public testing::CudaTest {
 protected:
  void TearDown() override {
    profile::set_enabled(false);
    profile::reset();
  }
};

TEST_F(CudaProfile, ScopeMeasuresGpuTimeOfItsKernels) {
  const Tensor a = testing::on_gpu(testing::random_cpu({1024, 1024}, DType::f32, 1));
  profile::reset();
  profile::set_enabled(true);
  for (int i = 0; i < 3; ++i) {
    profile::Scope scope("matmul x8", Device::cuda(0));
    Tensor c = a;
    for (int k = 0; k < 8; ++k) c = raw::matmul(c, a);
  }
  { profile::Scope host("host only"); }
  const std::vector<profile::Stats> stats = profile::snapshot();
  ASSERT_EQ(stats.size(), 2u);
  EXPECT_EQ(stats[0].name, "matmul x8");
  EXPECT_EQ(stats[0].calls, 3);
  EXPECT_EQ(stats[0].gpu_calls, 3);
  // 8 GEMMs of 2 GFLOP each take well over 10 us on any GPU, and less than a second.
  EXPECT_GT(stats[0].gpu_total_ms, 0.01);
  EXPECT_LT(stats[0].gpu_max_ms, 1000.0);
  EXPECT_EQ(stats[1].gpu_calls, 0);
}

TEST_F(CudaProfile, TimesTheStreamThatIsCurrent) {
  const Tensor a = testing::on_gpu(testing::random_cpu({512, 512}, DType::f32, 2));
  const DeviceStream side = DeviceStream::create(Device::cuda(0));
  profile::reset();
  profile::set_enabled(true);
  {
    DeviceStreamScope use(side);
    profile::Scope scope("side", Device::cuda(0));
    Tensor c = raw::matmul(a, a);
    side.record_use(c);
  }
  const std::vector<profile::Stats> stats = profile::snapshot();
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_EQ(stats[0].gpu_calls, 1);
  EXPECT_GT(stats[0].gpu_total_ms, 0.0);
}

TEST_F(CudaProfile, DeviceScopeTimesPlainScopes) {
  const Tensor a = testing::on_gpu(testing::random_cpu({512, 512}, DType::f32, 3));
  profile::reset();
  profile::set_enabled(true);
  {
    profile::DeviceScope rank(Device::cuda(0));
    profile::Scope scope("library op");
    Tensor c = raw::matmul(a, a);
  }
  const std::vector<profile::Stats> stats = profile::snapshot();
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_EQ(stats[0].gpu_calls, 1);
  EXPECT_GT(stats[0].gpu_total_ms, 0.0);
}

TEST_F(CudaProfile, DisabledScopesRecordNothing) {
  profile::reset();
  { profile::Scope scope("off", Device::cuda(0)); }
  EXPECT_TRUE(profile::snapshot().empty());
}

}  // namespace
}  // namespace cpf
