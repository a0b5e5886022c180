// The multi-tensor f32 -> bf16 cast (raw::to_many, framework/tensor/cuda/cast_many.cu) on the GPU: bit
// for bit raw::to's rounding (ties to even, infinities, NaN, values that round up to the next binade),
// for lists longer than one launch (64 pairs), tensors spanning several chunks of 4096 elements with a
// ragged tail, empty tensors, and sources at offsets that rule out 16-byte loads.
#include "framework/tensor/ops/cast_many.h"
#include "cuda_test_utils.h"
#include "framework/tensor/ops/views.h"

namespace cpf {
namespace {

using testing::on_cpu;
using testing::on_gpu;
using testing::random_cpu;

class CudaCastManyTest : public testing::CudaTest {};

::testing::AssertionResult equal(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype()) return ::testing::AssertionFailure() << a.dtype() << " vs " << b.dtype();
  return testing::all_close(a, b, 0.0, 0.0);
}

TEST_F(CudaCastManyTest, EqualsToOnLongListsAndOddSizes) {
  std::vector<Tensor> cpu;
  for (int i = 0; i < 150; ++i) {
    const int64_t n = i % 7 == 0 ? 3 * 4096 + 5 : (i % 5 == 0 ? 0 : 1 + 37 * i);
    cpu.push_back(random_cpu({n}, DType::f32, 100 + i, -50, 50));
  }
  // Special values: ties to even, the largest f32 (rounds to inf), inf, NaN, subnormals, -0.
  cpu.push_back(from_vector<float>(
      {1.00390625f, 1.01171875f, 3.4028235e38f, INFINITY, -INFINITY, NAN, 1e-40f, -0.0f, 65504.0f, 1.0f + 1.0f / 256},
      {10}));
  std::vector<Tensor> gpu;
  for (const Tensor& t : cpu) gpu.push_back(on_gpu(t));
  const std::vector<Tensor> out = raw::to_many(gpu, DType::bf16);
  ASSERT_EQ(out.size(), cpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) {
    EXPECT_EQ(out[i].device(), Device::cuda(0)) << i;
    EXPECT_EQ(out[i].shape(), cpu[i].shape()) << i;
    EXPECT_TRUE(equal(on_cpu(out[i]), raw::to(cpu[i], DType::bf16))) << "tensor " << i;
  }
}

TEST_F(CudaCastManyTest, UnalignedAndStridedSources) {
  const Tensor base = on_gpu(random_cpu({2, 9001}, DType::f32, 7));
  const Tensor shifted = raw::narrow(raw::flatten(base), 0, 1, 9000);          // starts 4 bytes in: scalar path
  const Tensor strided = raw::transpose(raw::reshape(base, {9001, 2}), 0, 1);  // made contiguous first
  const std::vector<Tensor> out = raw::to_many({shifted, strided, base}, DType::bf16);
  EXPECT_TRUE(equal(on_cpu(out[0]), raw::to(on_cpu(shifted), DType::bf16)));
  EXPECT_TRUE(equal(on_cpu(out[1]), raw::to(on_cpu(strided), DType::bf16)));
  EXPECT_TRUE(equal(on_cpu(out[2]), raw::to(on_cpu(base), DType::bf16)));
}

}  // namespace
}  // namespace cpf
