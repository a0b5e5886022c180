// cuDNN's FP8 attention forward (attention/cuda/cudnn_fp8_forward.h) against the bf16 cuDNN attention of the
// same values: q, k and v cast to E4M3 with power-of-two scales, so their dequantised values are exact in
// bf16 and both sides attend over the same numbers. What differs is FP8's: the probabilities cast to E4M3
// before their matmul (3 mantissa bits) and the output cast to E4M3. The output must stay within 5% RMS of
// bf16's (E4M3 rounds by up to 6.25%, 2% RMS, and P's rounding averages over a row), the row statistics
// within 1e-2 (S is the same f32 product), and the recorded amaxes must be those of P and O. Masks: none,
// causal, and causal with grouped keys (GQA). The backward (cudnn_fp8_backward.h) likewise against the bf16
// backward, at head dim 128. Refusals with their messages.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "attention/attention_op.h"
#include "attention/cuda/backend_selection.h"
#include "attention/cuda/cudnn_fp8_backward.h"
#include "attention/cuda/cudnn_fp8_forward.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/fp8.h"
#include "framework/tensor/ops/reduce.h"
#include "framework/tensor/ops/views.h"
#include "tests/attention/cuda/attention_gpu_support.h"

namespace cpf {
namespace {

using testing::on_cpu;
using testing::on_gpu;
using testing::random_cpu;

class CudnnFp8Attention : public testing::CudaTest {
 protected:
  void SetUp() override {
    testing::CudaTest::SetUp();
    if (IsSkipped()) return;
    if (!attention_cuda::built_with_cudnn()) GTEST_SKIP() << "this build has no cuDNN (CPF_WITH_CUDNN=OFF)";
  }
};

Tensor gpu_scalar(float v) { return on_gpu(from_vector(std::vector<float>{v}, {})); }
float value(const Tensor& t) { return on_cpu(raw::to(t, DType::f32)).item<float>(); }

// The largest power-of-two scale that keeps amax within the format's largest value.
float pow2_scale(float amax, DType fp8) {
  return std::exp2(std::floor(std::log2(static_cast<float>(raw::fp8_max(fp8)) / amax)));
}

// x cast to fp8 (E4M3 unless named) with pow2_scale of its amax, and its scale.
struct Cast {
  Tensor q;
  float scale;
  Tensor dequantized;  // bf16, exact
};
Cast cast(const Tensor& x, DType fp8 = DType::f8e4m3) {
  const float scale = pow2_scale(value(raw::abs_max(x)), fp8);
  Cast c{raw::quantize_fp8(x, gpu_scalar(scale), fp8), scale, Tensor()};
  c.dequantized = raw::dequantize_fp8(c.q, gpu_scalar(1.0f / scale), DType::bf16);
  return c;
}

double rms(const Tensor& x) {
  const Tensor f = on_cpu(raw::to(x, DType::f64));
  return std::sqrt(raw::mean(raw::mul(f, f), {}).item<double>());
}

struct Case {
  int64_t heads, kv_heads;
  bool causal;
};

TEST_F(CudnnFp8Attention, ForwardStaysWithinFp8RoundingOfBf16) {
  const int64_t b = 2, s = 256, d = 64;
  for (const Case& c : {Case{4, 4, false}, Case{4, 4, true}, Case{4, 2, true}}) {
    const std::string what =
        "h " + std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) + (c.causal ? " causal" : " no mask");
    const Cast q = cast(on_gpu(random_cpu({b, s, c.heads, d}, DType::bf16, 1, -2.0, 2.0)));
    const Cast k = cast(on_gpu(random_cpu({b, s, c.kv_heads, d}, DType::bf16, 2, -2.0, 2.0)));
    const Cast v = cast(on_gpu(random_cpu({b, s, c.kv_heads, d}, DType::bf16, 3, -2.0, 2.0)));
    const AttentionSpec spec{.qkv_format = QkvFormat::bshd, .mask = c.causal ? MaskType::causal : MaskType::no_mask};
    const raw::AttentionForward ref = raw::attention_forward(q.dequantized, k.dequantized, v.dequantized, spec,
                                                             std::nullopt, {.backend = AttentionBackend::cudnn});
    const float scale_o = 64.0f;  // |O| <= max |v| < 4
    const attention_cuda::Fp8AttentionScales scales{.descale_q = gpu_scalar(1.0f / q.scale),
                                                    .descale_k = gpu_scalar(1.0f / k.scale),
                                                    .descale_v = gpu_scalar(1.0f / v.scale),
                                                    .scale_s = gpu_scalar(448.0f),
                                                    .descale_s = gpu_scalar(1.0f / 448.0f),
                                                    .scale_o = gpu_scalar(scale_o)};
    attention_cuda::Fp8AttentionForward f;
    ASSERT_NO_THROW(
        f = attention_cuda::cudnn_fp8_attention_forward(q.q, k.q, v.q, scales, 1.0 / std::sqrt(double(d)), c.causal))
        << what;
    const Tensor out = raw::dequantize_fp8(f.out, gpu_scalar(1.0f / scale_o), DType::f32);
    const Tensor ref_out = raw::to(ref.out, DType::f32);
    const double error = rms(raw::sub(out, ref_out)) / rms(ref_out);
    std::printf("[fp8 attention] %s: output RMS error %.4f of bf16's, amax_s %.4f, amax_o %.4f (bf16 max |O| %.4f)\n",
                what.c_str(), error, value(f.amax_s), value(f.amax_o), value(raw::abs_max(ref_out)));
    EXPECT_LT(error, 0.05) << what;
    const Tensor stats = raw::reshape(f.stats, {b, c.heads, s});
    EXPECT_LT(value(raw::abs_max(raw::sub(stats, ref.lse))), 1e-2) << what;
    EXPECT_GT(value(f.amax_s), 0.0f) << what;
    EXPECT_LE(value(f.amax_s), 1.0f) << what;
    EXPECT_NEAR(value(f.amax_o), value(raw::abs_max(ref_out)), 0.05 * value(raw::abs_max(ref_out))) << what;
  }
}

// The backward (head dim 128, which Hopper's FP8 backward needs) against the bf16 backward of the same
// values: the FP8 forward's output and statistics, dequantised, and dO cast to E5M2, feed both. The
// gradients come out in E5M2 (2 mantissa bits: up to 12.5% off each), after dP was cast to E5M2 too, so
// they must stay within 20% RMS of bf16's; their amaxes within 15% of bf16's largest gradient. dP's scale
// comes from a first call's amax, as delayed scaling would pick it.
TEST_F(CudnnFp8Attention, BackwardStaysWithinFp8RoundingOfBf16) {
  const int64_t b = 1, s = 256, d = 128;
  for (const Case& c : {Case{2, 2, false}, Case{2, 2, true}, Case{4, 2, true}}) {
    const std::string what =
        "h " + std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) + (c.causal ? " causal" : " no mask");
    const Cast q = cast(on_gpu(random_cpu({b, s, c.heads, d}, DType::bf16, 11, -2.0, 2.0)));
    const Cast k = cast(on_gpu(random_cpu({b, s, c.kv_heads, d}, DType::bf16, 12, -2.0, 2.0)));
    const Cast v = cast(on_gpu(random_cpu({b, s, c.kv_heads, d}, DType::bf16, 13, -2.0, 2.0)));
    const Cast dout = cast(on_gpu(random_cpu({b, s, c.heads, d}, DType::bf16, 14, -1.0, 1.0)), DType::f8e5m2);
    const double softmax_scale = 1.0 / std::sqrt(double(d));
    const float scale_o = 64.0f;
    const attention_cuda::Fp8AttentionScales fs{gpu_scalar(1.0f / q.scale), gpu_scalar(1.0f / k.scale),
                                                gpu_scalar(1.0f / v.scale), gpu_scalar(448.0f),
                                                gpu_scalar(1.0f / 448.0f),  gpu_scalar(scale_o)};
    attention_cuda::Fp8AttentionForward f;
    ASSERT_NO_THROW(f = attention_cuda::cudnn_fp8_attention_forward(q.q, k.q, v.q, fs, softmax_scale, c.causal))
        << what;
    const Tensor out = raw::dequantize_fp8(f.out, gpu_scalar(1.0f / scale_o), DType::bf16);
    const Tensor lse = raw::reshape(f.stats, {b, c.heads, s});
    const AttentionSpec spec{.qkv_format = QkvFormat::bshd, .mask = c.causal ? MaskType::causal : MaskType::no_mask};
    const raw::AttentionGrads ref =
        raw::attention_backward(dout.dequantized, Tensor(), q.dequantized, k.dequantized, v.dequantized, out, lse, spec,
                                std::nullopt, {.backend = AttentionBackend::cudnn});
    const Tensor* refs[] = {&ref.dq, &ref.dk, &ref.dv};
    float grad_scale[3];
    for (int i = 0; i < 3; ++i) grad_scale[i] = pow2_scale(value(raw::abs_max(*refs[i])), DType::f8e5m2);
    attention_cuda::Fp8AttentionBackwardScales bs{.descale_q = fs.descale_q,
                                                  .descale_k = fs.descale_k,
                                                  .descale_v = fs.descale_v,
                                                  .descale_o = gpu_scalar(1.0f / scale_o),
                                                  .descale_do = gpu_scalar(1.0f / dout.scale),
                                                  .scale_s = fs.scale_s,
                                                  .descale_s = fs.descale_s,
                                                  .scale_dp = gpu_scalar(1.0f),
                                                  .descale_dp = gpu_scalar(1.0f),
                                                  .scale_dq = gpu_scalar(grad_scale[0]),
                                                  .scale_dk = gpu_scalar(grad_scale[1]),
                                                  .scale_dv = gpu_scalar(grad_scale[2])};
    attention_cuda::Fp8AttentionBackward g;
    ASSERT_NO_THROW(g = attention_cuda::cudnn_fp8_attention_backward(q.q, k.q, v.q, f.out, dout.q, f.stats, bs,
                                                                     softmax_scale, c.causal))
        << what;
    const float dp_scale = pow2_scale(value(g.amax_dp), DType::f8e5m2);
    bs.scale_dp = gpu_scalar(dp_scale);
    bs.descale_dp = gpu_scalar(1.0f / dp_scale);
    g = attention_cuda::cudnn_fp8_attention_backward(q.q, k.q, v.q, f.out, dout.q, f.stats, bs, softmax_scale,
                                                     c.causal);
    const Tensor grads[] = {g.dq, g.dk, g.dv};
    const Tensor amaxes[] = {g.amax_dq, g.amax_dk, g.amax_dv};
    const char* names[] = {"dq", "dk", "dv"};
    for (int i = 0; i < 3; ++i) {
      const Tensor got = raw::dequantize_fp8(grads[i], gpu_scalar(1.0f / grad_scale[i]), DType::f32);
      const Tensor want = raw::to(*refs[i], DType::f32);
      const double error = rms(raw::sub(got, want)) / rms(want);
      const float ref_max = value(raw::abs_max(want));
      std::printf("[fp8 attention backward] %s %s: RMS error %.4f of bf16's, amax %.4f (bf16 max %.4f), amax_dp %g\n",
                  what.c_str(), names[i], error, value(amaxes[i]), ref_max, value(g.amax_dp));
      EXPECT_LT(error, 0.2) << what << " " << names[i];
      EXPECT_NEAR(value(amaxes[i]), ref_max, 0.15 * ref_max) << what << " " << names[i];
    }
  }
}

TEST_F(CudnnFp8Attention, RefusesWhatItCannotTake) {
  const Tensor one = gpu_scalar(1.0f);
  const attention_cuda::Fp8AttentionScales scales{one, one, one, one, one, one};
  const Tensor q8 = raw::quantize_fp8(on_gpu(random_cpu({1, 64, 2, 64}, DType::bf16, 4)), one, DType::f8e4m3);
  const Tensor q16 = on_gpu(random_cpu({1, 64, 2, 64}, DType::bf16, 5));
  EXPECT_CPF_ERROR(attention_cuda::cudnn_fp8_attention_forward(q16, q8, q8, scales, 0.125, true),
                   "cudnn_fp8_attention_forward: q, k and v must be contiguous (B, S, H, D) f8e4m3 CUDA tensors, got "
                   "[1,64,2,64] bf16");
  const Tensor k3 = raw::quantize_fp8(on_gpu(random_cpu({1, 64, 3, 64}, DType::bf16, 6)), one, DType::f8e4m3);
  EXPECT_CPF_ERROR(attention_cuda::cudnn_fp8_attention_forward(q8, k3, k3, scales, 0.125, true),
                   "cudnn_fp8_attention_forward: k [1,64,3,64] and v [1,64,3,64] must be (B, S, H_kv, D) beside q "
                   "[1,64,2,64] with H a multiple of H_kv");
  attention_cuda::Fp8AttentionScales missing = scales;
  missing.scale_o = Tensor();
  EXPECT_CPF_ERROR(attention_cuda::cudnn_fp8_attention_forward(q8, q8, q8, missing, 0.125, true),
                   "cudnn_fp8_attention_forward: every scale and descale must be a () f32 tensor on cuda:0");

  const attention_cuda::Fp8AttentionBackwardScales bs{one, one, one, one, one, one, one, one, one, one, one, one};
  const Tensor stats = on_gpu(zeros({1, 2, 64, 1}));
  EXPECT_CPF_ERROR(attention_cuda::cudnn_fp8_attention_backward(q8, q8, q8, q8, q16, stats, bs, 0.125, true),
                   "cudnn_fp8_attention_backward: q, k, v and out must be contiguous (B, S, H, D) f8e4m3 CUDA tensors "
                   "and d_out f8e5m2 or f8e4m3, got [1,64,2,64] bf16");
  EXPECT_CPF_ERROR(
      attention_cuda::cudnn_fp8_attention_backward(q8, q8, q8, q8, q8, on_gpu(zeros({1, 2, 64})), bs, 0.125, true),
      "cudnn_fp8_attention_backward: stats must be the forward's contiguous (B, H, S, 1) f32 on cuda:0, "
      "got [1,2,64] f32");
  attention_cuda::Fp8AttentionBackwardScales no_dq = bs;
  no_dq.scale_dq = Tensor();
  EXPECT_CPF_ERROR(attention_cuda::cudnn_fp8_attention_backward(q8, q8, q8, q8, q8, stats, no_dq, 0.125, true),
                   "cudnn_fp8_attention_backward: every scale and descale must be a () f32 tensor on cuda:0");
}

}  // namespace
}  // namespace cpf
