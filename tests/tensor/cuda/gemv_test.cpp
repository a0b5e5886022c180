// The few-row GEMV kernel (framework/tensor/cuda/gemv.cu, cuda::gemv_applies): a linear layer's forward on
// 1-8 rows (decoding) runs there instead of cuBLASLt. Against the CPU reference computed in f64 from the same
// rounded operands, through the ops that reach it: raw::linear (with and without bias: DeviceOps::matmul_bias
// and matmul), raw::linear_gelu (the GELU epilogue and its pre-activation) and raw::matmul on a transposed
// weight; f32 and bf16, K from one 16-byte vector to 3072 (GPT-2's MLP), N not a multiple of the block's 8
// columns, a strided row view. Shapes it must not take (9 rows, a weight that is not transposed, K not a
// whole number of vectors, mixed dtypes) stay on cuBLASLt and still match.
#include "cuda_test_utils.h"
#include "framework/tensor/cuda/cuda.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/linear.h"
#include "framework/tensor/ops/matmul.h"
#include "framework/tensor/ops/views.h"

namespace cpf {
namespace {

using testing::on_cpu;
using testing::on_gpu;
using testing::random_cpu;
using testing::rel_error;

class CudaGemvTest : public testing::CudaTest {};

// Norm-wise: f32 sums in another order (1e-6 relative), bf16 outputs rounded once (2^-9).
double tolerance(DType dtype) { return dtype == DType::f32 ? 2e-6 : 4e-3; }

Tensor f64(const Tensor& t) { return raw::to(on_cpu(t), DType::f64); }

struct Case {
  int64_t m, k, n;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> c{{1, 8, 1},    {1, 768, 2304}, {1, 3072, 768}, {2, 64, 33},
                                   {3, 136, 20}, {5, 768, 50},   {8, 256, 129},  {1, 768, 50304}};
  return c;
}

std::string name_of(DType dtype, const Case& c, bool bias) {
  return dtype_name(dtype) + " M=" + std::to_string(c.m) + " K=" + std::to_string(c.k) + " N=" + std::to_string(c.n) +
         (bias ? " bias" : "");
}

TEST_F(CudaGemvTest, LinearOnFewRowsMatchesTheCpu) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (const Case& c : cases()) {
      for (bool bias : {true, false}) {
        const Tensor x = random_cpu({c.m, c.k}, dtype, 1), w = random_cpu({c.n, c.k}, dtype, 2);
        const Tensor b = bias ? random_cpu({c.n}, dtype, 3) : Tensor();
        const std::string what = name_of(dtype, c, bias);
        const Tensor gx = on_gpu(x), gw = on_gpu(w), gb = bias ? on_gpu(b) : Tensor();
        const Tensor probe = empty({c.m, c.n}, {.dtype = dtype, .device = Device::cuda(0)});
        EXPECT_TRUE(cuda::gemv_applies(probe, gx, raw::transpose(gw, 0, 1), gb)) << what;
        const Tensor got = raw::linear(gx, gw, gb);
        const Tensor want = raw::linear(f64(x), f64(w), bias ? f64(b) : Tensor());
        EXPECT_EQ(got.dtype(), dtype) << what;
        EXPECT_LT(rel_error(f64(got), want), tolerance(dtype)) << what;
      }
    }
  }
}

TEST_F(CudaGemvTest, LinearGeluKeepsThePreActivationAndMatchesTheCpu) {
  // N a multiple of 8: linear_gelu takes the epilogue only where cuBLASLt's aux allows it.
  const std::vector<Case> gelu_cases{{1, 768, 3072}, {2, 64, 64}, {3, 72, 16}, {5, 136, 40}, {8, 256, 136}};
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (const Case& c : gelu_cases) {
      for (bool bias : {true, false}) {
        const Tensor x = random_cpu({c.m, c.k}, dtype, 4), w = random_cpu({c.n, c.k}, dtype, 5);
        const Tensor b = bias ? random_cpu({c.n}, dtype, 6) : Tensor();
        const raw::LinearGelu got = raw::linear_gelu(on_gpu(x), on_gpu(w), bias ? on_gpu(b) : Tensor());
        const Tensor pre = raw::linear(f64(x), f64(w), bias ? f64(b) : Tensor());
        // GELU of the rounded pre-activation, as the unfused path computes it.
        const Tensor gelu = raw::unary(raw::UnaryOp::gelu, raw::to(raw::to(pre, dtype), DType::f64));
        const std::string what = name_of(dtype, c, bias);
        EXPECT_LT(rel_error(f64(got.pre), pre), tolerance(dtype)) << what;
        EXPECT_LT(rel_error(f64(got.out), gelu), dtype == DType::f32 ? 1e-5 : 8e-3) << what;
      }
    }
  }
}

TEST_F(CudaGemvTest, StridedRowsAndPlainMatmulOfATransposedWeight) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    // The first 64 columns of a (4, 128) matrix: 4 rows with a row stride of 128 elements.
    const Tensor wide = random_cpu({4, 128}, dtype, 7), w = random_cpu({40, 64}, dtype, 8);
    const Tensor x = raw::narrow(on_gpu(wide), 1, 0, 64);  // (4, 64) view
    const Tensor w_t = raw::transpose(on_gpu(w), 0, 1);    // (64, 40) view
    const Tensor probe = empty({4, 40}, {.dtype = dtype, .device = Device::cuda(0)});
    EXPECT_TRUE(cuda::gemv_applies(probe, x, w_t, Tensor())) << dtype_name(dtype);
    const Tensor got = raw::matmul(x, w_t);
    const Tensor want = raw::matmul(f64(x), raw::transpose(f64(w), 0, 1));
    EXPECT_LT(rel_error(f64(got), want), tolerance(dtype)) << dtype_name(dtype);
  }
}

TEST_F(CudaGemvTest, OtherShapesStayOnCublasLt) {
  const Device gpu = Device::cuda(0);
  const auto out = [&](int64_t m, int64_t n, DType dtype) { return empty({m, n}, {.dtype = dtype, .device = gpu}); };
  const Tensor x9 = on_gpu(random_cpu({9, 64}, DType::f32, 9)), w = on_gpu(random_cpu({16, 64}, DType::f32, 10));
  EXPECT_FALSE(cuda::gemv_applies(out(9, 16, DType::f32), x9, raw::transpose(w, 0, 1), Tensor())) << "9 rows";
  const Tensor x1 = raw::narrow(x9, 0, 0, 1);
  const Tensor plain = on_gpu(random_cpu({64, 16}, DType::f32, 11));  // (K, N) contiguous: not a weight's transpose
  EXPECT_FALSE(cuda::gemv_applies(out(1, 16, DType::f32), x1, plain, Tensor())) << "b not transposed";
  const Tensor x_odd = on_gpu(random_cpu({1, 6}, DType::bf16, 12)),
               w_odd = on_gpu(random_cpu({16, 6}, DType::bf16, 13));
  EXPECT_FALSE(cuda::gemv_applies(out(1, 16, DType::bf16), x_odd, raw::transpose(w_odd, 0, 1), Tensor())) << "K = 6";
  EXPECT_FALSE(cuda::gemv_applies(out(1, 16, DType::f32), raw::to(x1, DType::bf16),
                                  raw::transpose(raw::to(w, DType::bf16), 0, 1), Tensor()))
      << "bf16 operands, f32 output";
  const Tensor shifted = raw::narrow(on_gpu(random_cpu({1, 72}, DType::f32, 14)), 1, 1, 64);  // 4 bytes off
  EXPECT_FALSE(cuda::gemv_applies(out(1, 16, DType::f32), shifted, raw::transpose(w, 0, 1), Tensor()))
      << "a misaligned";
  const Tensor rows66 = raw::narrow(on_gpu(random_cpu({2, 66}, DType::f32, 15)), 1, 0, 64);  // row stride 66
  EXPECT_FALSE(cuda::gemv_applies(out(2, 16, DType::f32), rows66, raw::transpose(w, 0, 1), Tensor()))
      << "a row stride that is no whole number of vectors";
  EXPECT_FALSE(cuda::gemv_applies(out(1, 8, DType::f32), x1, raw::transpose(w, 0, 1), Tensor())) << "out (1, 8)";
  // And they still compute the same function.
  for (const Tensor& x : {x9, x1, shifted, rows66}) {
    const Tensor got = raw::linear(x, w, Tensor());
    EXPECT_LT(rel_error(f64(got), raw::linear(f64(x), f64(w), Tensor())), tolerance(DType::f32));
  }
  const Tensor got_odd = raw::linear(x_odd, w_odd, Tensor());
  EXPECT_LT(rel_error(f64(got_odd), raw::linear(f64(x_odd), f64(w_odd), Tensor())), tolerance(DType::bf16));
}

}  // namespace
}  // namespace cpf
