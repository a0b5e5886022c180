// The FP8 casts fused into an activation (framework/tensor/ops/fp8_activation.h) on the CPU, where they are
// the composition itself: the activation of each kind and layout (SwiGLU's packed [gate | up]), the amax
// and both copies of the cast against abs_max and
// quantize_fp8_transposed of the activation's output, an amax folded into a running one, and every
// refusal with its message (the gradient: tests/autograd/fp8_linear_test.cpp).
// tests/tensor/cuda/fp8_activation_test.cpp holds the CUDA kernels to these.
#include "framework/tensor/ops/fp8_activation.h"

#include <gtest/gtest.h>

#include <vector>

#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/swiglu.h"
#include "framework/tensor/ops/views.h"
#include "tests/support/test_utils.h"

namespace cpf {
namespace {

using raw::CastActivation;
using testing::all_close;
using testing::random_tensor;
using testing::same_bytes;

Tensor bf16_random(const Shape& shape, uint64_t seed) {
  return raw::to(random_tensor(shape, DType::f32, seed, -3.0, 3.0), DType::bf16);
}

TEST(Fp8Activation, AppliesGeluAndSwigluOfThePackedHalves) {
  const Tensor pre = bf16_random({32, 48}, 1);
  EXPECT_TRUE(same_bytes(raw::apply_cast_activation(pre, CastActivation::gelu), raw::unary(raw::UnaryOp::gelu, pre)));
  const Tensor h = raw::apply_cast_activation(pre, CastActivation::swiglu);  // (32, 24)
  ASSERT_EQ(h.shape(), (Shape{32, 24}));
  EXPECT_TRUE(same_bytes(
      h, raw::swiglu(raw::contiguous(raw::narrow(pre, 1, 0, 24)), raw::contiguous(raw::narrow(pre, 1, 24, 24)))));
  EXPECT_STREQ(raw::cast_activation_name(CastActivation::swiglu), "swiglu");
}

TEST(Fp8Activation, AmaxAndCastsEqualThoseOfTheActivationsOutput) {
  for (CastActivation act : {CastActivation::gelu, CastActivation::swiglu}) {
    for (DType fp8 : {DType::f8e4m3, DType::f8e5m2}) {
      const Tensor pre = bf16_random({48, act == CastActivation::gelu ? 80 : 160}, 4);
      const Tensor h = raw::apply_cast_activation(pre, act);  // (48, 80)
      Tensor computed;  // the CPU has no fused kernel: it computes h and hands it back
      const Tensor amax = raw::activation_abs_max(pre, act, &computed);
      EXPECT_EQ(amax.item<float>(), raw::abs_max(h).item<float>());
      EXPECT_TRUE(same_bytes(computed, h));
      const Tensor scale = raw::fp8_scale(amax, fp8, 1);
      Tensor running = from_vector(std::vector<float>{0.25f}, {});
      Tensor running_ref = from_vector(std::vector<float>{0.25f}, {});
      const raw::Fp8Transposed fused = raw::quantize_activation_fp8_transposed(pre, act, scale, fp8, running);
      const raw::Fp8Transposed ref = raw::quantize_fp8_transposed(h, scale, fp8, running_ref);
      EXPECT_TRUE(same_bytes(fused.q, ref.q));
      EXPECT_TRUE(same_bytes(fused.qt, ref.qt));
      ASSERT_EQ(fused.qt.shape(), (Shape{80, 48}));
      EXPECT_EQ(running.item<float>(), running_ref.item<float>());
      EXPECT_EQ(running.item<float>(), amax.item<float>());
      const raw::Fp8Transposed only_t = raw::quantize_activation_fp8_transposed(pre, act, scale, fp8, {}, false);
      EXPECT_FALSE(only_t.q.defined());
      EXPECT_TRUE(same_bytes(only_t.qt, ref.qt));
    }
  }
}

TEST(Fp8Activation, RefusesBadInputsWithTheirNames) {
  const Tensor pre = bf16_random({16, 32}, 5);
  const Tensor scale = from_vector(std::vector<float>{1.0f}, {});
  const auto gelu_act = CastActivation::gelu, swiglu_act = CastActivation::swiglu;
  EXPECT_CPF_ERROR(raw::activation_abs_max(raw::to(pre, DType::f32), gelu_act),
                   "activation_abs_max: pre must be bf16 (FP8 training computes its activations in bf16), got f32");
  EXPECT_CPF_ERROR(raw::activation_abs_max(raw::reshape(pre, {512}), gelu_act),
                   "activation_abs_max: pre must be 2-D (rows, features), got [512]");
  EXPECT_CPF_ERROR(
      raw::quantize_activation_fp8_transposed(raw::narrow(pre, 1, 0, 15), swiglu_act, scale, DType::f8e4m3),
      "quantize_activation_fp8_transposed: swiglu's pre (R, 2 C) = [gate | up] needs an even width, got "
      "[16,15]");
  EXPECT_CPF_ERROR(raw::quantize_activation_fp8_transposed(pre, gelu_act, scale, DType::bf16),
                   "quantize_fp8_transposed: the target dtype must be f8e4m3 or f8e5m2, got bf16");
  EXPECT_CPF_ERROR(
      raw::quantize_activation_fp8_transposed(pre, gelu_act, from_vector(std::vector<float>{1, 2}, {2}), DType::f8e4m3),
      "quantize_fp8_transposed: scale must be a () f32 tensor, got shape [2]");
  EXPECT_CPF_ERROR(raw::cast_activation_backward(bf16_random({16, 32}, 6), pre, swiglu_act),
                   "cast_activation_backward: grad_h must be (16, 16) bf16 for swiglu's pre [16,32], got [16,32] bf16");
  EXPECT_CPF_ERROR(raw::apply_cast_activation(Tensor(), gelu_act),
                   "apply_cast_activation: argument 'pre' is an undefined tensor");
}

}  // namespace
}  // namespace cpf
