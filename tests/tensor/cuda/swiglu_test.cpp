// SwiGLU's gate on the GPU (framework/tensor/cuda/swiglu.cu) against the CPU reference: the Llama 124M
// MLP's shape in f32 and bf16, contiguous and as the two halves of one fused (N, 2I) projection, and the
// scalar path (a column count that is no multiple of the vector, a row start off 16-byte alignment).
// The packed backward's halves of one gradient buffer. Both compute in f32 (bf16 rounds once), so they
// differ only by expf's last bits.
#include "framework/tensor/ops/swiglu.h"
#include "cuda_test_utils.h"
#include "framework/tensor/ops/views.h"

namespace cpf {
namespace {

using testing::all_close;
using testing::on_cpu;
using testing::on_gpu;
using testing::random_cpu;

class CudaSwigluTest : public testing::CudaTest {};

double tol_for(DType dtype) { return dtype == DType::bf16 ? 1.0 / 128 : 1e-5; }

// gate, up: (rows, cols) views of one (rows, 2 cols + extra) tensor at column offsets go and uo.
void expect_match(int64_t rows, int64_t cols, int64_t width, int64_t go, int64_t uo, DType dtype, uint64_t seed) {
  const Tensor h = random_cpu({rows, width}, dtype, seed);
  const Tensor dy = random_cpu({rows, cols}, dtype, seed + 1);
  const Tensor hg = on_gpu(h), dyg = on_gpu(dy);
  const Tensor g = raw::narrow(h, 1, go, cols), u = raw::narrow(h, 1, uo, cols);
  const Tensor gg = raw::narrow(hg, 1, go, cols), ug = raw::narrow(hg, 1, uo, cols);
  const std::string what = dtype_name(dtype) + " rows " + std::to_string(rows) + " cols " + std::to_string(cols) +
                           " offsets " + std::to_string(go) + "/" + std::to_string(uo);
  const double tol = tol_for(dtype);
  EXPECT_TRUE(all_close(on_cpu(raw::swiglu(gg, ug)), raw::swiglu(g, u), tol, tol)) << what;
  const raw::SwigluGrads dev = raw::swiglu_backward(dyg, gg, ug), ref = raw::swiglu_backward(dy, g, u);
  EXPECT_TRUE(all_close(on_cpu(dev.d_gate), ref.d_gate, tol, tol)) << "d_gate " << what;
  EXPECT_TRUE(all_close(on_cpu(dev.d_up), ref.d_up, tol, tol)) << "d_up " << what;
}

TEST_F(CudaSwigluTest, ModelShapeMatchesTheCpu) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    expect_match(1024, 2048, 2048 * 2, 0, 2048, dtype, 11);  // the fused projection's halves
    expect_match(512, 2048, 2048, 0, 0, dtype, 13);          // gate and up the same contiguous tensor
  }
}

TEST_F(CudaSwigluTest, ScalarPathMatchesTheCpu) {
  for (DType dtype : {DType::f32, DType::bf16, DType::f64}) {
    expect_match(37, 13, 26, 0, 13, dtype, 21);  // cols no multiple of the vector width
    expect_match(33, 16, 35, 1, 18, dtype, 23);  // row starts off 16-byte alignment
  }
}

TEST_F(CudaSwigluTest, PackedGradientHalvesMatchTheCpu) {
  // swiglu_packed's backward: d_gate and d_up written into the halves of one (N, 2I) buffer (row stride
  // 2I), on the vector path (I = 2048) and the scalar one (I = 13).
  for (const int64_t cols : {int64_t{2048}, int64_t{13}}) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      const Tensor h = random_cpu({64, 2 * cols}, dtype, 41), dy = random_cpu({64, cols}, dtype, 42);
      const Tensor hg = on_gpu(h);
      Tensor dh = zeros({64, 2 * cols}, {.dtype = dtype, .device = Device::cuda(0)});
      raw::swiglu_backward_into(on_gpu(dy), raw::narrow(hg, 1, 0, cols), raw::narrow(hg, 1, cols, cols),
                                raw::narrow(dh, 1, 0, cols), raw::narrow(dh, 1, cols, cols));
      const raw::SwigluGrads ref = raw::swiglu_backward(dy, raw::narrow(h, 1, 0, cols), raw::narrow(h, 1, cols, cols));
      const Tensor got = on_cpu(dh);
      const double tol = tol_for(dtype);
      const std::string what = dtype_name(dtype) + " cols " + std::to_string(cols);
      EXPECT_TRUE(all_close(raw::narrow(got, 1, 0, cols), ref.d_gate, tol, tol)) << "d_gate " << what;
      EXPECT_TRUE(all_close(raw::narrow(got, 1, cols, cols), ref.d_up, tol, tol)) << "d_up " << what;
    }
  }
}

TEST_F(CudaSwigluTest, LeadingDimsFoldAndOutputsAreContiguous) {
  const Tensor g = random_cpu({2, 3, 40}, DType::bf16, 31), u = random_cpu({2, 3, 40}, DType::bf16, 32);
  const Tensor y = raw::swiglu(on_gpu(g), on_gpu(u));
  EXPECT_EQ(y.shape(), (Shape{2, 3, 40}));
  EXPECT_TRUE(y.is_contiguous());
  EXPECT_TRUE(all_close(on_cpu(y), raw::swiglu(g, u), 1.0 / 128, 1.0 / 128));
}

}  // namespace
}  // namespace cpf
