// cuDNN's FP8 attention forward (attention/cuda/cudnn_fp8_forward.h) against the bf16 cuDNN attention of the
// same values: q, k and v cast to E4M3 with power-of-two scales, so their dequantised values are exact in
// bf16 and both sides attend over the same numbers. What differs is FP8's: the probabilities cast to E4M3
// before their matmul (3 mantissa bits) and the output cast to E4M3. The output must stay within 5% RMS of
// bf16's (E4M3 rounds by up to 6.25%, 2% RMS, and P's rounding averages over a row), the row statistics
// within 1e-2 (S is the same f32 product), and the recorded amaxes must be those of P and O. Masks: none,
// causal, and causal with grouped keys (GQA). Refusals with their messages.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "attention/attention_op.h"
#include "attention/cuda/backend_selection.h"
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

// x cast to E4M3 with the largest power-of-two scale that keeps max |x| within 448, and its scale.
struct Cast {
  Tensor q;
  float scale;
  Tensor dequantized;  // bf16, exact
};
Cast cast(const Tensor& x) {
  const float scale = std::exp2(std::floor(std::log2(448.0f / value(raw::abs_max(x)))));
  Cast c{raw::quantize_fp8(x, gpu_scalar(scale), DType::f8e4m3), scale, Tensor()};
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
}

}  // namespace
}  // namespace cpf
