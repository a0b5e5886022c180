// attention/cuda/device_tables.h: the sequence tables of cuDNN / unfused attention calls go to the
// device once and are served from the thread's cache while the same contents come back.
#include <gtest/gtest.h>

#include "attention/cuda/device_tables.h"
#include "framework/tensor/device_stream.h"
#include "framework/tensor/ops/views.h"
#include "tests/tensor/cuda/cuda_test_utils.h"

namespace cpf::attention_cuda {
namespace {

class DeviceTablesTest : public testing::CudaTest {};

TEST_F(DeviceTablesTest, SameContentsAreUploadedOnce) {
  const DeviceTableStats before = device_table_stats();
  const Tensor a = device_table(from_vector<int32_t>({0, 64, 128, 1000}, {4}), Device::cuda(0));
  const Tensor b = device_table(from_vector<int32_t>({0, 64, 128, 1000}, {4}), Device::cuda(0));
  EXPECT_EQ(a.raw_data(), b.raw_data());  // the cached tensor itself
  EXPECT_EQ(a.to_vector<int32_t>(), (std::vector<int32_t>{0, 64, 128, 1000}));
  // Other contents, another dtype or another shape of the same bytes are other tables.
  const Tensor c = device_table(from_vector<int32_t>({0, 64, 128, 999}, {4}), Device::cuda(0));
  const Tensor d = device_table(from_vector<int64_t>({0, 64}, {2}), Device::cuda(0));
  const Tensor e = device_table(from_vector<int32_t>({0, 64, 128, 1000}, {2, 2}), Device::cuda(0));
  EXPECT_EQ(c.to_vector<int32_t>()[3], 999);
  EXPECT_EQ(d.dtype(), DType::i64);
  EXPECT_EQ(e.shape(), (Shape{2, 2}));
  const DeviceTableStats after = device_table_stats();
  EXPECT_EQ(after.uploads - before.uploads, 4u);
  EXPECT_EQ(after.hits - before.hits, 1u);
}

TEST_F(DeviceTablesTest, TheOldestTablesAreEvictedPastTheLimit) {
  const Tensor first = device_table(from_vector<int64_t>({-1}, {1}), Device::cuda(0));
  for (int64_t i = 0; i < static_cast<int64_t>(kDeviceTableMaxEntries); ++i) {
    (void)device_table(from_vector<int64_t>({i, 7}, {2}), Device::cuda(0));
  }
  const DeviceTableStats before = device_table_stats();
  const Tensor again = device_table(from_vector<int64_t>({-1}, {1}), Device::cuda(0));
  EXPECT_EQ(device_table_stats().uploads - before.uploads, 1u);  // evicted: uploaded anew
  EXPECT_EQ(again.to_vector<int64_t>(), (std::vector<int64_t>{-1}));
}

// A table is read only on the stream it was uploaded on: another current stream (the CP ring's side
// stream) gets its own copy, so it never reads one whose upload is queued on a stream it did not wait for.
TEST_F(DeviceTablesTest, AnotherStreamGetsItsOwnCopy) {
  const Tensor host = from_vector<int32_t>({3, 1, 4, 1, 5}, {5});
  const Tensor on_main = device_table(host, Device::cuda(0));
  // Alive for the process: the thread's cache keeps the side copy, released on this stream when evicted.
  static const DeviceStream side = DeviceStream::create(Device::cuda(0));
  Tensor on_side, again_side;
  const DeviceTableStats before = device_table_stats();
  {
    const DeviceStreamScope scope(side);
    on_side = device_table(host, Device::cuda(0));
    again_side = device_table(host, Device::cuda(0));
  }
  EXPECT_EQ(device_table_stats().uploads - before.uploads, 1u);
  EXPECT_EQ(device_table_stats().hits - before.hits, 1u);
  EXPECT_NE(on_side.raw_data(), on_main.raw_data());
  EXPECT_EQ(on_side.raw_data(), again_side.raw_data());
  EXPECT_EQ(device_table(host, Device::cuda(0)).raw_data(), on_main.raw_data());  // back on the main stream
  side.synchronize();
  EXPECT_EQ(on_side.to_vector<int32_t>(), (std::vector<int32_t>{3, 1, 4, 1, 5}));
}

TEST_F(DeviceTablesTest, RejectsATableNotOnTheHost) {
  EXPECT_CPF_ERROR(device_table(testing::on_gpu(from_vector<int64_t>({1}, {1})), Device::cuda(0)),
                   "device_table: the table must be a contiguous CPU tensor, got one on cuda:0");
  const Tensor strided = raw::transpose(from_vector<int64_t>({1, 2, 3, 4}, {2, 2}), 0, 1);
  EXPECT_CPF_ERROR(device_table(strided, Device::cuda(0)),
                   "device_table: the table must be a contiguous CPU tensor, got one on cpu (not contiguous)");
}

}  // namespace
}  // namespace cpf::attention_cuda
