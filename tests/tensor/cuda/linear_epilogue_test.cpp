// The GEMM epilogues of the linear ops (framework/tensor/ops/linear.h, DeviceOps::matmul_epilogue)
// against the CPU reference computed in f64 from the same rounded operands: GELU_AUX[_BIAS] (linear_gelu),
// DGELU[_BGRAD] (linear_dgelu), BGRADB with f32 output of bf16 operands and beta = 1 (linear_param_grads);
// f32 and bf16, bias on/off, leading dims 1-3, N % 8 != 0 (the unfused fallback), and the entry's
// refusals. Errors are norm-wise as in matmul_test.cpp (bf16 outputs a few 1e-3 from rounding alone).
#include "cuda_test_utils.h"
#include "framework/tensor/device_ops.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/linear.h"
#include "framework/tensor/ops/matmul.h"
#include "framework/tensor/ops/reduce.h"
#include "framework/tensor/ops/views.h"

namespace cpf {
namespace {

using testing::on_cpu;
using testing::on_gpu;
using testing::random_cpu;
using testing::rel_error;

class CudaLinearEpilogueTest : public testing::CudaTest {};

double tolerance(DType dtype) { return dtype == DType::f32 ? 1e-5 : 8e-3; }
// GELU and its derivative in an epilogue: cuBLASLt may evaluate tanh with a fast approximation, so f32
// gets a looser bound than the GEMM alone (the measured error is to be read from a GPU run).
double gelu_tolerance(DType dtype) { return dtype == DType::f32 ? 5e-4 : 8e-3; }

Tensor f64(const Tensor& t) { return raw::to(on_cpu(t), DType::f64); }

// x shapes with 1, 2 and 3 leading dims; K = 40.
const std::vector<Shape>& x_shapes() {
  static const std::vector<Shape> shapes{{37, 40}, {3, 13, 40}, {2, 3, 5, 40}};
  return shapes;
}

Tensor gelu64(const Tensor& t) { return raw::unary(raw::UnaryOp::gelu, t); }

TEST_F(CudaLinearEpilogueTest, LinearGeluMatchesTheCpu) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (const Shape& xs : x_shapes()) {
      for (int64_t n : {64, 20}) {  // 20: no GELU epilogue (aux ld % 8), the unfused fallback
        for (bool bias : {true, false}) {
          const Tensor x = random_cpu(xs, dtype, 1), w = random_cpu({n, 40}, dtype, 2);
          const Tensor b = bias ? random_cpu({n}, dtype, 3) : Tensor();
          const raw::LinearGelu got = raw::linear_gelu(on_gpu(x), on_gpu(w), bias ? on_gpu(b) : Tensor());
          const Tensor pre =
              raw::linear(raw::to(x, DType::f64), raw::to(w, DType::f64), bias ? raw::to(b, DType::f64) : Tensor());
          const std::string what =
              dtype_name(dtype) + " x " + shape_str(xs) + " N=" + std::to_string(n) + (bias ? " bias" : "");
          ASSERT_EQ(got.out.shape(), pre.shape()) << what;
          EXPECT_EQ(got.out.dtype(), dtype) << what;
          EXPECT_LT(rel_error(f64(got.pre), pre), tolerance(dtype)) << what;
          EXPECT_LT(rel_error(f64(got.out), gelu64(pre)), gelu_tolerance(dtype)) << what;
        }
      }
    }
  }
}

TEST_F(CudaLinearEpilogueTest, LinearDgeluMatchesTheCpu) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (const Shape& xs : x_shapes()) {
      Shape gs = xs, ps = xs;
      gs.back() = 24;  // grad_y (..., N)
      for (int64_t k : {40, 20}) {
        ps.back() = k;  // pre (..., K)
        for (bool bias : {true, false}) {
          const Tensor g = random_cpu(gs, dtype, 4), w = random_cpu({24, k}, dtype, 5);
          const Tensor pre = random_cpu(ps, dtype, 6, -3, 3);
          const raw::LinearDgelu got = raw::linear_dgelu(on_gpu(g), on_gpu(w), on_gpu(pre), bias);
          const Tensor pre64 = raw::to(pre, DType::f64);
          const Tensor gh = raw::matmul(raw::to(g, DType::f64), raw::to(w, DType::f64));
          const Tensor ref = raw::unary_backward(raw::UnaryOp::gelu, gh, pre64, pre64);
          const std::string what = dtype_name(dtype) + " grad " + shape_str(gs) + " K=" + std::to_string(k);
          EXPECT_LT(rel_error(f64(got.grad_pre), ref), gelu_tolerance(dtype)) << what;
          ASSERT_EQ(got.bias_grad.defined(), bias) << what;
          if (!bias) continue;
          Shape lead(ps.size() - 1);
          for (size_t d = 0; d + 1 < ps.size(); ++d) lead[d] = static_cast<int64_t>(d);
          EXPECT_LT(rel_error(f64(got.bias_grad), raw::sum(ref, lead)), gelu_tolerance(dtype)) << what;
        }
      }
    }
  }
}

// dW = dY^T X and db = the column sums of dY: bf16 -> f32 is checked at f32's tolerance (a bf16
// rounding of dW would fail it); beta = 1 adds to what the output holds.
TEST_F(CudaLinearEpilogueTest, ParamGradsMatchTheCpu) {
  struct Types {
    DType in, out;
  };
  for (const Types& t :
       {Types{DType::f32, DType::f32}, Types{DType::bf16, DType::bf16}, Types{DType::bf16, DType::f32}}) {
    for (const Shape& xs : x_shapes()) {
      Shape gs = xs;
      gs.back() = 36;
      for (bool bias : {true, false}) {
        for (bool accumulate : {false, true}) {
          const Tensor g = random_cpu(gs, t.in, 7), x = random_cpu(xs, t.in, 8);
          const Tensor start = random_cpu({36, 40}, t.out, 9);
          const Tensor acc = accumulate ? raw::clone(on_gpu(start)) : Tensor();
          const raw::LinearParamGrads got = raw::linear_param_grads(on_gpu(g), on_gpu(x), t.out, bias, acc);
          const Tensor g2 = raw::reshape(raw::to(g, DType::f64), {g.numel() / 36, 36});
          const Tensor x2 = raw::reshape(raw::to(x, DType::f64), {x.numel() / 40, 40});
          Tensor ref = raw::matmul(raw::transpose(g2, 0, 1), x2);
          if (accumulate) ref = raw::add(ref, raw::to(start, DType::f64));
          const std::string what = dtype_name(t.in) + "->" + dtype_name(t.out) + " x " + shape_str(xs) +
                                   (bias ? " bias" : "") + (accumulate ? " accumulate" : "");
          EXPECT_EQ(got.weight.dtype(), t.out) << what;
          if (accumulate) EXPECT_EQ(got.weight.raw_data(), acc.raw_data()) << what;
          EXPECT_LT(rel_error(f64(got.weight), ref), tolerance(t.out)) << what;
          ASSERT_EQ(got.bias.defined(), bias) << what;
          if (bias) EXPECT_LT(rel_error(f64(got.bias), raw::sum(g2, {0})), tolerance(t.out)) << what;
        }
      }
    }
  }
}

// cuBLASLt's heuristic picks its kernel from the epilogue pointers' alignment: the algorithm cache keys
// on it (LtGemm::align_epilogue), so a bias or aux 16 bytes past a 256-byte boundary, after the same
// shape ran with aligned ones, gets an algorithm chosen for its own alignment (a reused one could read
// them with wider accesses than they allow).
TEST_F(CudaLinearEpilogueTest, EpilogueVectorsAtA16ByteOffsetMatchTheCpu) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    const int64_t skew = 16 / static_cast<int64_t>(dtype_size(dtype));  // elements in 16 bytes
    const Tensor x = random_cpu({37, 40}, dtype, 11), w = random_cpu({64, 40}, dtype, 12);
    const Tensor b = random_cpu({64}, dtype, 13);
    const Tensor pre64 = raw::linear(raw::to(x, DType::f64), raw::to(w, DType::f64), raw::to(b, DType::f64));
    for (int64_t offset : {int64_t{0}, skew}) {
      const Tensor bias_buffer = zeros({64 + skew}, {.dtype = dtype, .device = Device::cuda(0)});
      const Tensor bias = raw::narrow(bias_buffer, 0, offset, 64);
      raw::copy_(bias, on_gpu(b));
      const raw::LinearGelu got = raw::linear_gelu(on_gpu(x), on_gpu(w), bias);
      const std::string what = dtype_name(dtype) + " bias at +" + std::to_string(offset);
      EXPECT_LT(rel_error(f64(got.pre), pre64), tolerance(dtype)) << what;
      EXPECT_LT(rel_error(f64(got.out), gelu64(pre64)), gelu_tolerance(dtype)) << what;
      // The saved pre-activation as an aux input at the same offset (a contiguous view of a flat buffer).
      const Tensor g = random_cpu({37, 24}, dtype, 14), w2 = random_cpu({24, 64}, dtype, 15);
      const Tensor aux_buffer = zeros({37 * 64 + skew}, {.dtype = dtype, .device = Device::cuda(0)});
      const Tensor aux = raw::reshape(raw::narrow(aux_buffer, 0, offset, 37 * 64), {37, 64});
      raw::copy_(aux, got.pre);
      const raw::LinearDgelu d = raw::linear_dgelu(on_gpu(g), on_gpu(w2), aux, true);
      const Tensor p64 = f64(got.pre);
      const Tensor gh = raw::matmul(raw::to(g, DType::f64), raw::to(w2, DType::f64));
      const Tensor ref = raw::unary_backward(raw::UnaryOp::gelu, gh, p64, p64);
      EXPECT_LT(rel_error(f64(d.grad_pre), ref), gelu_tolerance(dtype)) << what << " (dgelu)";
      EXPECT_LT(rel_error(f64(d.bias_grad), raw::sum(ref, {0})), gelu_tolerance(dtype)) << what << " (dgelu)";
    }
  }
}

// At GPT-2's MLP shapes (bf16) cuBLASLt runs every epilogue fused: the entry reports false when it has
// no algorithm (the raw ops then fall back), which would silently lose the fusion.
TEST_F(CudaLinearEpilogueTest, Gpt2ShapesRunFused) {
  const auto entry = find_device_ops(DeviceType::cuda)->matmul_epilogue;
  ASSERT_NE(entry, nullptr);
  const TensorOptions bf{.dtype = DType::bf16, .device = Device::cuda(0)};
  const Tensor x = on_gpu(random_cpu({2048, 768}, DType::bf16, 1));
  const Tensor w_in = on_gpu(random_cpu({3072, 768}, DType::bf16, 2));   // fc_in (I, C)
  const Tensor w_out = on_gpu(random_cpu({768, 3072}, DType::bf16, 3));  // fc_out (C, I)
  const Tensor b_in = on_gpu(random_cpu({3072}, DType::bf16, 4));
  Tensor h = empty({2048, 3072}, bf), pre = empty({2048, 3072}, bf);
  EXPECT_TRUE(
      entry(h, x, raw::transpose(w_in, 0, 1), {.epilogue = DeviceGemmEpilogue::gelu, .bias = b_in, .aux = pre}));
  const Tensor gy = on_gpu(random_cpu({2048, 768}, DType::bf16, 5));
  Tensor dpre = empty({2048, 3072}, bf), db = empty({3072}, bf);
  EXPECT_TRUE(entry(dpre, gy, w_out, {.epilogue = DeviceGemmEpilogue::dgelu, .aux = pre, .bias_grad = db}));
  EXPECT_TRUE(entry(dpre, gy, w_out, {.epilogue = DeviceGemmEpilogue::dgelu, .aux = pre}));
  Tensor dw = empty({3072, 768}, {.dtype = DType::f32, .device = Device::cuda(0)});
  Tensor dbias = empty({3072}, {.dtype = DType::f32, .device = Device::cuda(0)});
  EXPECT_TRUE(entry(dw, raw::transpose(dpre, 0, 1), x, {.bias_grad = dbias}));
  EXPECT_TRUE(entry(dw, raw::transpose(dpre, 0, 1), x, {.bias_grad = dbias, .accumulate = true}));
}

TEST_F(CudaLinearEpilogueTest, EntryRefusesWhatCuBLASLtCannotRun) {
  const auto entry = find_device_ops(DeviceType::cuda)->matmul_epilogue;
  ASSERT_NE(entry, nullptr);
  const TensorOptions bf{.dtype = DType::bf16, .device = Device::cuda(0)};
  const Tensor a = empty({16, 32}, bf), b = empty({32, 20}, bf);
  Tensor out = empty({16, 20}, bf), aux = empty({16, 20}, bf);
  EXPECT_CPF_ERROR(entry(out, a, b, {.epilogue = DeviceGemmEpilogue::gelu, .aux = aux}),
                   "matmul_epilogue (cuda, gelu): out [16,20] has N = 20 columns; cuBLASLt's GELU epilogues need N "
                   "to be a multiple of 8");
  const Tensor b24 = empty({32, 24}, bf);
  Tensor out24 = empty({16, 24}, bf);
  EXPECT_CPF_ERROR(entry(out24, a, b24, {.epilogue = DeviceGemmEpilogue::gelu, .aux = aux}),
                   "matmul_epilogue (cuda, gelu): aux must be a contiguous [16,24] bf16 tensor, got [16,20]");
  EXPECT_CPF_ERROR(
      entry(out24, a, b24, {.epilogue = DeviceGemmEpilogue::dgelu, .aux = empty({16, 24}, bf), .accumulate = true}),
      "matmul_epilogue (cuda, dgelu): accumulate is supported with epilogue none only");
  Tensor out32 = empty({16, 24}, {.dtype = DType::f32, .device = Device::cuda(0)});
  EXPECT_CPF_ERROR(entry(out32, a, b24, {.epilogue = DeviceGemmEpilogue::gelu, .aux = empty({16, 24}, bf)}),
                   "matmul_epilogue (cuda, gelu): operands bf16/bf16 with output f32 are not supported");
  EXPECT_CPF_ERROR(entry(out24, a, b24, {.bias_grad = empty({24}, bf)}),
                   "matmul_epilogue (cuda, none): bias_grad must be a contiguous, 16-byte aligned (16) vector of bf16, "
                   "got [24]");
  EXPECT_CPF_ERROR(entry(out24, a, b24, {.bias = empty({24}, bf)}),
                   "matmul_epilogue (cuda, none): a forward bias goes with the gelu epilogue only");
}

}  // namespace
}  // namespace cpf
