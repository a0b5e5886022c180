// RoPE backward on the GPU (framework/tensor/cuda/rope.cu: one angle per token and rotation pair,
// applied to every head) against the CPU at a model's shape, on the gradient layouts attention hands
// back: contiguous (B, T, H, D), a (B, T, H, D) view of (B, H, T, D), and thd; a partial rotary dim.
// nn_test.cpp covers the small shapes, both directions and both position forms.
#include "cuda_test_utils.h"
#include "framework/tensor/ops/rope.h"
#include "framework/tensor/ops/views.h"

namespace cpf {
namespace {

using testing::all_close;
using testing::on_cpu;
using testing::on_gpu;
using testing::random_cpu;

class CudaRopeBackwardTest : public testing::CudaTest {};

Tensor positions(int64_t t) {
  std::vector<int64_t> v(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) v[static_cast<size_t>(i)] = i * 3 % 4099;  // up to a few thousand
  return from_vector(v, {t});
}

double tol_for(DType dtype) { return dtype == DType::bf16 ? 1.0 / 128 : 1e-5; }

TEST_F(CudaRopeBackwardTest, ModelShapeLayoutsMatchTheCpu) {
  const int64_t b = 2, t = 300, h = 12, d = 64;
  const Tensor pos = positions(t);
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (int64_t rot : {int64_t{-1}, int64_t{32}}) {
      const std::string what = dtype_name(dtype) + " rot " + std::to_string(rot);
      const Tensor g = random_cpu({b, t, h, d}, dtype, 91);
      EXPECT_TRUE(all_close(on_cpu(raw::rope_backward(on_gpu(g), on_gpu(pos), 10000.0, rot, false)),
                            raw::rope_backward(g, pos, 10000.0, rot, false), 1e-5, tol_for(dtype)))
          << "bshd " << what;
      const Tensor bhtd = random_cpu({b, h, t, d}, dtype, 92);
      EXPECT_TRUE(
          all_close(on_cpu(raw::rope_backward(raw::transpose(on_gpu(bhtd), 1, 2), on_gpu(pos), 500000.0, rot, false)),
                    raw::rope_backward(raw::transpose(bhtd, 1, 2), pos, 500000.0, rot, false), 1e-5, tol_for(dtype)))
          << "bhtd view " << what;
      const Tensor thd = random_cpu({t, h, d}, dtype, 93);
      EXPECT_TRUE(all_close(on_cpu(raw::rope_backward(on_gpu(thd), on_gpu(pos), 10000.0, rot, false)),
                            raw::rope_backward(thd, pos, 10000.0, rot, false), 1e-5, tol_for(dtype)))
          << "thd " << what;
    }
  }
}

TEST_F(CudaRopeBackwardTest, BackwardUndoesTheForward) {
  // The rotation is orthogonal: backward(forward(x)) is x up to f32 rounding, on the device alone.
  const Tensor pos = positions(64);
  const Tensor x = on_gpu(random_cpu({3, 64, 4, 32}, DType::f32, 94));
  const Tensor y = raw::rope(x, on_gpu(pos), 10000.0, -1, false);
  EXPECT_TRUE(all_close(on_cpu(raw::rope_backward(y, on_gpu(pos), 10000.0, -1, false)), on_cpu(x), 1e-5, 1e-5));
}

}  // namespace
}  // namespace cpf
