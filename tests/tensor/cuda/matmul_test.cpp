// cuBLASLt GEMMs against a float64 CPU reference: f32 (exact f32 math, and TF32 when allowed), f64,
// bf16 operands with f32 accumulation; transposed views read in place, batched and broadcast batch
// dims, vectors, K = 0. Errors are norm-wise (||out - ref|| / ||ref||, see METHOD: f32 far under
// 1e-3, TF32 near 3e-4, bf16 a few 1e-3 from rounding the output to bf16 alone).
#include "framework/tensor/ops/matmul.h"
#include "cuda_test_utils.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/linear.h"
#include "framework/tensor/ops/views.h"

namespace cpf {
namespace {

using testing::on_cpu;
using testing::on_gpu;
using testing::random_cpu;
using testing::rel_error;

class CudaMatmulTest : public testing::CudaTest {
 protected:
  void TearDown() override { cuda::set_allow_tf32(false); }
};

double tolerance(DType dtype) {
  switch (dtype) {
    case DType::f64: return 1e-13;
    case DType::f32: return 1e-5;
    default: return 8e-3;  // bf16 output rounding: up to 2^-8 relative per element, ~2.3e-3 RMS
  }
}

// The reference: the same (already rounded) operands in f64 on the CPU.
Tensor reference(const Tensor& a, const Tensor& b) {
  return raw::matmul(raw::to(a, DType::f64), raw::to(b, DType::f64));
}

void expect_matmul(const Tensor& a, const Tensor& b, const Tensor& ga, const Tensor& gb, const std::string& what) {
  Tensor out = raw::matmul(ga, gb);
  EXPECT_EQ(out.device(), Device::cuda(0)) << what;
  EXPECT_EQ(out.dtype(), a.dtype()) << what;
  Tensor ref = reference(a, b);
  ASSERT_EQ(out.shape(), ref.shape()) << what;
  const double err = rel_error(on_cpu(out), ref);
  EXPECT_LT(err, tolerance(a.dtype())) << what << ": relative error " << err;
}

TEST_F(CudaMatmulTest, PlainAndTransposedOperands) {
  for (DType dtype : {DType::f32, DType::f64, DType::bf16}) {
    for (const auto& [m, k, n] :
         {std::tuple{64, 128, 96}, std::tuple{1, 300, 7}, std::tuple{33, 17, 1}, std::tuple{257, 129, 65}}) {
      Tensor a = random_cpu({m, k}, dtype, 41);
      Tensor b = random_cpu({k, n}, dtype, 42);
      const std::string what =
          dtype_name(dtype) + " " + std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n);
      expect_matmul(a, b, on_gpu(a), on_gpu(b), what);
      // a^T and b^T stored transposed: (k, m) and (n, k) tensors viewed through transpose, no copy.
      Tensor at = random_cpu({k, m}, dtype, 43);
      Tensor bt = random_cpu({n, k}, dtype, 44);
      expect_matmul(raw::transpose(at, 0, 1), raw::transpose(bt, 0, 1), raw::transpose(on_gpu(at), 0, 1),
                    raw::transpose(on_gpu(bt), 0, 1), what + " transposed");
      expect_matmul(a, raw::transpose(bt, 0, 1), on_gpu(a), raw::transpose(on_gpu(bt), 0, 1), what + " b^T");
    }
  }
}

TEST_F(CudaMatmulTest, BatchedBroadcastAndVectors) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    // (B, M, K) @ (B, K, N); (B, M, K) @ (K, N) (weights shared: batch stride 0);
    // (2, 1, M, K) @ (3, K, N) broadcast both ways; a sliced batch (non-mergeable batch strides).
    Tensor a = random_cpu({6, 40, 24}, dtype, 45);
    Tensor b = random_cpu({6, 24, 16}, dtype, 46);
    Tensor w = random_cpu({24, 16}, dtype, 47);
    expect_matmul(a, b, on_gpu(a), on_gpu(b), "batched");
    expect_matmul(a, w, on_gpu(a), on_gpu(w), "shared weights");
    Tensor a4 = random_cpu({2, 1, 40, 24}, dtype, 48);
    Tensor b3 = random_cpu({3, 24, 16}, dtype, 49);
    expect_matmul(a4, b3, on_gpu(a4), on_gpu(b3), "broadcast batch");
    Tensor big = random_cpu({4, 5, 40, 24}, dtype, 50);
    Tensor sliced = raw::slice(big, 1, 0, 5, 2);  // (4, 3, 40, 24) with a batch stride that does not merge
    Tensor b43 = random_cpu({4, 3, 24, 16}, dtype, 51);
    expect_matmul(sliced, b43, raw::slice(on_gpu(big), 1, 0, 5, 2), on_gpu(b43), "sliced batch");
    // Heads-style layout: (B, T, H, D) viewed as (B, H, T, D) without a copy, times its transpose.
    Tensor q = random_cpu({2, 50, 4, 32}, dtype, 52);
    Tensor qh = raw::transpose(q, 1, 2);
    Tensor gqh = raw::transpose(on_gpu(q), 1, 2);
    expect_matmul(qh, raw::transpose(qh, 2, 3), gqh, raw::transpose(gqh, 2, 3), "attention scores");
    // Vectors.
    Tensor v = random_cpu({24}, dtype, 53);
    expect_matmul(a, v, on_gpu(a), on_gpu(v), "matrix @ vector");
    expect_matmul(v, w, on_gpu(v), on_gpu(w), "vector @ matrix");
  }
}

TEST_F(CudaMatmulTest, Tf32IsOptIn) {
  Tensor a = random_cpu({256, 512}, DType::f32, 54);
  Tensor b = random_cpu({512, 128}, DType::f32, 55);
  const double exact = rel_error(on_cpu(raw::matmul(on_gpu(a), on_gpu(b))), reference(a, b));
  EXPECT_LT(exact, 1e-6);
  EXPECT_FALSE(cuda::allow_tf32());
  cuda::set_allow_tf32(true);
  const double tf32 = rel_error(on_cpu(raw::matmul(on_gpu(a), on_gpu(b))), reference(a, b));
  // TF32 keeps 10 mantissa bits of each input: errors near 2^-11 / sqrt(3) per product, averaging down.
  EXPECT_LT(tf32, 2e-3);
  EXPECT_GT(tf32, exact);  // the tensor cores were used
}

TEST_F(CudaMatmulTest, EmptyAndZeroInnerDims) {
  Tensor a = zeros({3, 0}, {.device = Device::cuda()});
  Tensor b = zeros({0, 4}, {.device = Device::cuda()});
  EXPECT_EQ(on_cpu(raw::matmul(a, b)).to_vector<float>(), std::vector<float>(12, 0.0f));
  const TensorOptions on_dev{.device = Device::cuda()};
  EXPECT_EQ(raw::matmul(zeros({0, 5}, on_dev), zeros({5, 2}, on_dev)).numel(), 0);
}

// raw::linear: the bias in cuBLASLt's epilogue (f32, bf16) against x @ W^T + b in f64 on the CPU; a
// GPT-2 projection, a ragged shape, 3-D input, a bias view at an odd offset (copied aligned) and f64
// (no epilogue: matmul then add).
TEST_F(CudaMatmulTest, LinearAddsTheBiasInTheEpilogue) {
  struct Case {
    Shape x, w;
  };
  for (const Case& c : {Case{{4096, 768}, {2304, 768}}, Case{{37, 19}, {23, 19}}, Case{{3, 5, 64}, {48, 64}}}) {
    for (DType dtype : {DType::f32, DType::bf16, DType::f64}) {
      Tensor x = random_cpu(c.x, dtype, 31);
      Tensor w = random_cpu(c.w, dtype, 32);
      Tensor b_storage = random_cpu({c.w[0] + 1}, dtype, 33);
      for (bool odd_offset : {false, true}) {
        Tensor b = raw::narrow(b_storage, 0, odd_offset ? 1 : 0, c.w[0]);  // (N)
        Tensor out = raw::linear(on_gpu(x), on_gpu(w), on_gpu(b));
        Tensor x64 = raw::to(x, DType::f64), w64 = raw::to(w, DType::f64), b64 = raw::to(b, DType::f64);
        Tensor ref = raw::binary(raw::BinaryOp::add, raw::matmul(x64, raw::transpose(w64, 0, 1)), b64);
        const std::string what = dtype_name(dtype) + " x " + shape_str(c.x) + (odd_offset ? " odd bias" : "");
        ASSERT_EQ(out.shape(), ref.shape()) << what;
        EXPECT_EQ(out.dtype(), dtype) << what;
        EXPECT_LT(rel_error(raw::to(on_cpu(out), DType::f64), ref), tolerance(dtype)) << what;
      }
      Tensor no_bias = raw::linear(on_gpu(x), on_gpu(w), Tensor());
      Tensor ref = raw::matmul(raw::to(x, DType::f64), raw::transpose(raw::to(w, DType::f64), 0, 1));
      EXPECT_LT(rel_error(raw::to(on_cpu(no_bias), DType::f64), ref), tolerance(dtype)) << "no bias";
    }
  }
}

}  // namespace
}  // namespace cpf
