// Host->device copies below the staging threshold go through the pinned upload ring
// (framework/tensor/cuda/upload_ring.cuh): the data arrives intact however many laps the ring makes,
// while earlier copies may still be queued, and on any stream; a small upload makes the host wait for
// nothing (cuda::host_sync_counts()).
#include "cuda_test_utils.h"
#include "framework/tensor/ops/reduce.h"

namespace cpf {
namespace {

using testing::on_cpu;
using testing::on_gpu;

class CudaUploadRingTest : public testing::CudaTest {};

std::vector<float> pattern(int64_t n, int64_t salt) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>((i * 31 + salt * 7) % 1009);
  return v;
}

TEST_F(CudaUploadRingTest, ManyLapsArriveIntact) {
  // 120 copies of 900 KiB (about 105 MiB, several laps of the 16 MiB ring), queued back to back
  // behind a long reduction, then read back.
  const Tensor busy = on_gpu(testing::random_tensor({4096, 4096}, DType::f32, 5));
  (void)raw::sum(busy);
  std::vector<Tensor> uploaded;
  for (int64_t k = 0; k < 120; ++k) uploaded.push_back(on_gpu(from_vector(pattern(230400, k), {230400})));
  for (int64_t k = 0; k < 120; ++k) {
    EXPECT_EQ(on_cpu(uploaded[static_cast<size_t>(k)]).to_vector<float>(), pattern(230400, k)) << "copy " << k;
  }
}

TEST_F(CudaUploadRingTest, ASmallUploadDoesNotWaitAndTheSourceMayBeReusedAtOnce) {
  { const Tensor warm = on_gpu(from_vector(pattern(1000, 0), {1000})); }  // the allocator holds a block
  std::vector<float> host = pattern(1000, 1);
  const cuda::HostSyncCounts before = cuda::host_sync_counts();
  const Tensor a = on_gpu(from_vector(host, {1000}));
  const cuda::HostSyncCounts n = cuda::host_sync_counts() - before;
  EXPECT_EQ(n.total(), 0u) << cuda::to_string(n);
  std::fill(host.begin(), host.end(), -1.0f);  // the copy has its own bytes already
  EXPECT_EQ(on_cpu(a).to_vector<float>(), pattern(1000, 1));
}

TEST_F(CudaUploadRingTest, UploadsOnAnotherStream) {
  const cuda::Stream side = cuda::Stream::create(0);
  Tensor t;
  {
    const cuda::StreamGuard guard(side);
    t = on_gpu(from_vector(pattern(5000, 2), {5000}));
    side.synchronize();
  }
  EXPECT_EQ(on_cpu(t).to_vector<float>(), pattern(5000, 2));
}

}  // namespace
}  // namespace cpf
