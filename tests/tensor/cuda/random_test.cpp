// Philox draws generated on the GPU against the same draws on the CPU: uniform and randint are
// bit-identical in every dtype; normal goes through CUDA's double log/cos (within a few f64 ulps of
// libm's), so f64 is compared to 1e-14 relative and f32/bf16, rounded from those doubles, to one step.
#include <cmath>
#include <cstring>

#include "cuda_test_utils.h"
#include "framework/core/generator.h"
#include "framework/tensor/random.h"

namespace cpf {
namespace {

using testing::on_cpu;

class CudaRandomTest : public testing::CudaTest {};

// Bit patterns of every element (as f64: every dtype here converts to it exactly).
bool bit_equal(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const auto x = a.to_vector<double>(), y = b.to_vector<double>();
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(double)) == 0;
}

TEST_F(CudaRandomTest, UniformAndRandintAreBitIdenticalToTheCpu) {
  const TensorOptions gpu{.device = Device::cuda(0)};
  for (DType dtype : {DType::f32, DType::f64, DType::bf16}) {
    Generator cpu_gen(1234), gpu_gen(1234);
    const Shape shape{301, 67};             // not a multiple of anything in particular
    for (int draw = 0; draw < 2; ++draw) {  // the second draw starts at the advanced offset
      Tensor c = uniform(shape, -2.0, 3.0, {.dtype = dtype}, &cpu_gen);
      Tensor g = uniform(shape, -2.0, 3.0, {.dtype = dtype, .device = gpu.device}, &gpu_gen);
      EXPECT_EQ(g.device(), Device::cuda(0));
      EXPECT_TRUE(bit_equal(on_cpu(g), c)) << dtype_name(dtype) << " draw " << draw;
      EXPECT_EQ(cpu_gen.offset(), gpu_gen.offset());
    }
    // A narrow range where f32/bf16 rounding reaches `high`: moved one step below on both sides.
    Tensor c = uniform({4096}, 1.0, 1.0 + 1e-3, {.dtype = dtype}, &cpu_gen);
    Tensor g = uniform({4096}, 1.0, 1.0 + 1e-3, {.dtype = dtype, .device = gpu.device}, &gpu_gen);
    EXPECT_TRUE(bit_equal(on_cpu(g), c)) << dtype_name(dtype) << " narrow range";
    // low == high and an empty draw.
    EXPECT_TRUE(bit_equal(on_cpu(uniform({5}, -0.5, -0.5, {.dtype = dtype, .device = gpu.device}, &gpu_gen)),
                          uniform({5}, -0.5, -0.5, {.dtype = dtype}, &cpu_gen)));
    EXPECT_EQ(uniform({0, 3}, 0.0, 1.0, {.dtype = dtype, .device = gpu.device}, &gpu_gen).numel(), 0);
  }
  for (DType dtype : {DType::i64, DType::i32, DType::f32}) {
    Generator cpu_gen(77), gpu_gen(77);
    for (auto [low, high] : {std::pair<int64_t, int64_t>{-5, 17}, {0, int64_t(1) << 40}, {3, 4}}) {
      // Values past i32's range have no defined conversion (C++ UB on the host, saturation on the GPU).
      if (dtype == DType::i32 && high > (int64_t(1) << 31)) continue;
      Tensor c = randint(low, high, {1000}, {.dtype = dtype}, &cpu_gen);
      Tensor g = randint(low, high, {1000}, {.dtype = dtype, .device = Device::cuda(0)}, &gpu_gen);
      EXPECT_TRUE(bit_equal(on_cpu(g), c)) << dtype_name(dtype) << " [" << low << ", " << high << ")";
    }
  }
}

TEST_F(CudaRandomTest, NormalMatchesTheCpuToTheLastBits) {
  for (DType dtype : {DType::f64, DType::f32, DType::bf16}) {
    Generator cpu_gen(99), gpu_gen(99);
    gpu_gen.set_state(99, 12345);  // any offset: element i uses block (seed, offset + i)
    cpu_gen.set_state(99, 12345);
    Tensor c = normal({200000}, 0.5, 2.0, {.dtype = dtype}, &cpu_gen);
    Tensor g = on_cpu(normal({200000}, 0.5, 2.0, {.dtype = dtype, .device = Device::cuda(0)}, &gpu_gen));
    EXPECT_EQ(cpu_gen.offset(), gpu_gen.offset());
    const auto x = g.to_vector<double>(), y = c.to_vector<double>();
    int64_t differ = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      if (x[i] == y[i]) continue;
      ++differ;
      // f64: a few ulps of CUDA's log/cos in the standard normal n, seen through 0.5 + 2 n (so relative to
      // the larger of its terms: results near 0 keep the absolute error of the sum); f32/bf16: one rounding
      // step of the type.
      const double step = dtype == DType::f64 ? 1e-14 : dtype == DType::f32 ? std::ldexp(1.0, -23) : 1.0 / 128;
      ASSERT_LE(std::abs(x[i] - y[i]), step * (0.5 + std::abs(y[i] - 0.5))) << dtype_name(dtype) << " element " << i;
    }
    // Rounded types only differ where the two doubles straddle a rounding boundary: (almost) never.
    if (dtype != DType::f64) EXPECT_LE(differ, 2) << dtype_name(dtype);
    std::printf("normal %s: %lld of %zu elements differ from the CPU\n", dtype_name(dtype).c_str(),
                static_cast<long long>(differ), x.size());
  }
}

}  // namespace
}  // namespace cpf
