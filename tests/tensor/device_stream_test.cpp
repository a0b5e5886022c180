// DeviceStream on the CPU: every stream is the one in-order stream, so the calls the CP ring makes
// are no-ops there and the same code runs on every device (the CUDA behaviour is tested in
// tests/tensor/cuda/backend_test.cpp).
#include <gtest/gtest.h>

#include "framework/tensor/device_stream.h"
#include "framework/tensor/ops/elementwise.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

TEST(DeviceStreamCpu, EveryStreamIsTheInOrderOne) {
  const Device cpu = Device::cpu();
  const DeviceStream current = DeviceStream::current(cpu);
  const DeviceStream created = DeviceStream::create(cpu);
  EXPECT_EQ(current, created);
  EXPECT_EQ(created.handle(), nullptr);
  EXPECT_EQ(created.device(), cpu);
  const Tensor x = full({8}, 2.0);
  created.wait_for(current);
  created.record_use(x);
  {
    const DeviceStreamScope scope(created);
    EXPECT_EQ(DeviceStream::current(cpu), current);
    EXPECT_EQ(raw::add(x, x).to_vector<float>(), std::vector<float>(8, 4.0f));
  }
  created.record_use(Tensor());  // an undefined tensor has no memory to record
}

}  // namespace
}  // namespace cpf
