// Softmax and log-softmax (forward and backward) on the GPU against the CPU: the last dim (a warp or
// a block per row) and inner dims (a thread per column), masked rows, every floating dtype.
#include <cmath>

#include "cuda_test_utils.h"
#include "framework/tensor/ops/softmax.h"
#include "framework/tensor/ops/views.h"

namespace cpf {
namespace {

using testing::all_close;
using testing::on_cpu;
using testing::on_gpu;
using testing::random_cpu;

class CudaSoftmaxTest : public testing::CudaTest {};

TEST_F(CudaSoftmaxTest, ForwardAndBackwardMatchTheCpu) {
  // (shape, dim): short rows, long rows (> 1024: a block per row), a middle dim, a leading dim.
  const std::vector<std::pair<Shape, int64_t>> cases{
      {{64, 100}, -1}, {{8, 5000}, 1}, {{4, 37, 65}, 1}, {{300, 20}, 0}, {{3, 1}, -1}};
  for (DType dtype : {DType::f32, DType::f64, DType::bf16}) {
    const double rtol = std::max(testing::rtol_for(dtype), 1e-5), atol = std::max(testing::atol_for(dtype), 1e-6);
    for (const auto& [shape, dim] : cases) {
      Tensor x = random_cpu(shape, dtype, 31, -8, 8);
      Tensor g = random_cpu(shape, dtype, 32);
      const std::string what = dtype_name(dtype) + " " + shape_str(shape) + " dim " + std::to_string(dim);
      Tensor y = raw::softmax(x, dim);
      Tensor ly = raw::log_softmax(x, dim);
      EXPECT_TRUE(all_close(on_cpu(raw::softmax(on_gpu(x), dim)), y, atol, rtol)) << "softmax " << what;
      EXPECT_TRUE(all_close(on_cpu(raw::log_softmax(on_gpu(x), dim)), ly, atol * 10, rtol)) << "log_softmax " << what;
      EXPECT_TRUE(all_close(on_cpu(raw::softmax_backward(on_gpu(g), on_gpu(y), dim)), raw::softmax_backward(g, y, dim),
                            atol * 10, rtol))
          << "softmax_backward " << what;
      EXPECT_TRUE(all_close(on_cpu(raw::log_softmax_backward(on_gpu(g), on_gpu(ly), dim)),
                            raw::log_softmax_backward(g, ly, dim), atol * 10, rtol))
          << "log_softmax_backward " << what;
    }
  }
}

TEST_F(CudaSoftmaxTest, RegisterRowsOfEveryWidthMatchTheCpu) {
  // Forward rows up to 1024 are held in registers: vector loads when the width is a multiple of the
  // vector, scalar otherwise, 1 to 32 elements per lane.
  for (DType dtype : {DType::f32, DType::f64, DType::bf16}) {
    const double rtol = std::max(testing::rtol_for(dtype), 1e-5), atol = std::max(testing::atol_for(dtype), 1e-6);
    for (int64_t size : {1, 2, 31, 33, 128, 257, 1000, 1023, 1024}) {
      Tensor x = random_cpu({37, size}, dtype, 34, -20, 20);
      const std::string what = dtype_name(dtype) + " size " + std::to_string(size);
      EXPECT_TRUE(all_close(on_cpu(raw::softmax(on_gpu(x), 1)), raw::softmax(x, 1), atol, rtol)) << what;
      EXPECT_TRUE(all_close(on_cpu(raw::log_softmax(on_gpu(x), 1)), raw::log_softmax(x, 1), atol * 10, rtol)) << what;
    }
  }
  // A NaN makes its row NaN; other rows are unaffected.
  Tensor x = from_vector<float>({1, NAN, 2, 1, 2, 3}, {2, 3});
  Tensor y = on_cpu(raw::softmax(on_gpu(x), 1));
  for (int64_t j = 0; j < 3; ++j) EXPECT_TRUE(std::isnan(y.to_vector<float>()[j]));
  EXPECT_TRUE(all_close(raw::select(y, 0, 1), raw::softmax(raw::select(x, 0, 1), 0), 1e-7, 1e-6));
}

TEST_F(CudaSoftmaxTest, MaskedRowsGiveZeroAndMinusInfinity) {
  const float inf = INFINITY;
  Tensor x = from_vector<float>({-inf, -inf, -inf, 0, -inf, 1, 2, 3, 4}, {3, 3});
  EXPECT_TRUE(all_close(on_cpu(raw::softmax(on_gpu(x), 1)), raw::softmax(x, 1), 1e-7, 1e-6));
  EXPECT_TRUE(all_close(on_cpu(raw::log_softmax(on_gpu(x), 1)), raw::log_softmax(x, 1), 1e-7, 1e-6));
  // The same along dim 0 (the column kernel).
  EXPECT_TRUE(all_close(on_cpu(raw::softmax(on_gpu(x), 0)), raw::softmax(x, 0), 1e-7, 1e-6));
  EXPECT_TRUE(all_close(on_cpu(raw::log_softmax(on_gpu(x), 0)), raw::log_softmax(x, 0), 1e-7, 1e-6));
  // Strided input: made contiguous first.
  Tensor big = random_cpu({40, 30}, DType::f32, 33, -5, 5);
  EXPECT_TRUE(all_close(on_cpu(raw::softmax(raw::transpose(on_gpu(big), 0, 1), 1)),
                        raw::softmax(raw::transpose(big, 0, 1), 1), 1e-6, 1e-5));
}

}  // namespace
}  // namespace cpf
