// Many weights cast to FP8 at once (framework/tensor/ops/fp8_rows.h) on the CPU, where each weight is cast by
// the per-weight ops: the amaxes and both copies of each cast against abs_max and quantize_fp8_transposed of
// the concatenated parts, amaxes folded into running ones, and every refusal with its message.
// tests/tensor/cuda/fp8_rows_test.cpp holds the one-launch CUDA kernel to these.
#include "framework/tensor/ops/fp8_rows.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/join.h"
#include "framework/tensor/ops/views.h"
#include "tests/support/test_utils.h"

namespace cpf {
namespace {

using testing::random_tensor;
using testing::same_bytes;

Tensor scalar(float v) { return from_vector(std::vector<float>{v}, {}); }

// q, k, v of one attention (three parts), a bf16 weight, and an f32 weight as one tensor.
std::vector<std::vector<Tensor>> some_weights() {
  return {{random_tensor({32, 24}, DType::f32, 1, -3.0, 3.0), random_tensor({8, 24}, DType::f32, 2),
           random_tensor({8, 24}, DType::f32, 3)},
          {raw::to(random_tensor({16, 40}, DType::f32, 4, -500.0, 500.0), DType::bf16)},
          {random_tensor({12, 8}, DType::f32, 5)}};
}

TEST(Fp8Rows, AmaxesAreThoseOfTheConcatenations) {
  const auto weights = some_weights();
  const std::vector<Tensor> amax = raw::abs_max_rows(weights);
  ASSERT_EQ(amax.size(), weights.size());
  for (size_t i = 0; i < weights.size(); ++i) {
    EXPECT_EQ(amax[i].shape(), Shape{});
    EXPECT_EQ(amax[i].item<float>(), raw::abs_max(raw::cat(weights[i], 0)).item<float>()) << i;
  }
  EXPECT_TRUE(raw::abs_max_rows({}).empty());
}

TEST(Fp8Rows, CastsAreThoseOfTheConcatenationsWithTheirAmaxesFolded) {
  const auto weights = some_weights();
  std::vector<raw::Fp8RowsCast> casts;
  for (size_t i = 0; i < weights.size(); ++i) {
    casts.push_back({weights[i], scalar(i == 1 ? 0.5f : 60.0f), i == 2 ? Tensor() : scalar(1.0f)});
  }
  for (DType fp8 : {DType::f8e4m3, DType::f8e5m2}) {
    for (auto& c : casts) {
      if (c.amax_out.defined()) c.amax_out = scalar(1.0f);
    }
    const std::vector<raw::Fp8Transposed> got = raw::quantize_fp8_transposed_rows(casts, fp8);
    ASSERT_EQ(got.size(), casts.size());
    for (size_t i = 0; i < casts.size(); ++i) {
      const Tensor running = casts[i].amax_out.defined() ? scalar(1.0f) : Tensor();
      const raw::Fp8Transposed ref =
          raw::quantize_fp8_transposed(raw::cat(casts[i].parts, 0), casts[i].scale, fp8, running);
      EXPECT_TRUE(same_bytes(got[i].q, ref.q)) << i;
      EXPECT_TRUE(same_bytes(got[i].qt, ref.qt)) << i;
      if (running.defined()) EXPECT_EQ(casts[i].amax_out.item<float>(), running.item<float>()) << i;
    }
  }
}

TEST(Fp8Rows, RefusesWhatItCannotCast) {
  const Tensor a = random_tensor({8, 16}, DType::f32, 1);
  EXPECT_CPF_ERROR(raw::abs_max_rows({{}}), "abs_max_rows: weight 0 has no parts");
  EXPECT_CPF_ERROR(raw::abs_max_rows({{a, random_tensor({4, 8}, DType::f32, 2)}}),
                   "abs_max_rows: weight 0's parts must share one width, dtype and device, got [4,8] f32 on cpu "
                   "beside [8,16] f32 on cpu");
  EXPECT_CPF_ERROR(raw::abs_max_rows({{a}, {raw::transpose(a, 0, 1)}}),
                   "abs_max_rows: weight 1's parts must be contiguous 2-D (N_i, K) blocks");
  EXPECT_CPF_ERROR(raw::abs_max_rows({{raw::to(a, DType::f64)}}),
                   "abs_max_rows: weight 0's parts must be f32 or bf16, got f64");
  EXPECT_CPF_ERROR(raw::abs_max_rows({{Tensor()}}), "abs_max_rows");
  const auto cast = [&](const Tensor& scale, const Tensor& amax, DType fp8) {
    return raw::quantize_fp8_transposed_rows({{{a}, scale, amax}}, fp8);
  };
  EXPECT_CPF_ERROR(cast(scalar(1.0f), Tensor(), DType::bf16),
                   "quantize_fp8_transposed_rows: the target dtype must be f8e4m3 or f8e5m2, got bf16");
  EXPECT_CPF_ERROR(cast(Tensor(), Tensor(), DType::f8e4m3),
                   "quantize_fp8_transposed_rows: weight 0's scale must be a () f32 tensor on cpu");
  EXPECT_CPF_ERROR(cast(from_vector(std::vector<float>{1.0f, 2.0f}, {2}), Tensor(), DType::f8e4m3),
                   "quantize_fp8_transposed_rows: weight 0's scale must be a () f32 tensor on cpu");
  EXPECT_CPF_ERROR(cast(scalar(1.0f), raw::to(scalar(1.0f), DType::f64), DType::f8e4m3),
                   "quantize_fp8_transposed_rows: weight 0's amax_out must be undefined or a () f32 tensor on cpu");
  EXPECT_CPF_ERROR(raw::quantize_fp8_transposed_rows({{{}, scalar(1.0f), Tensor()}}, DType::f8e4m3),
                   "quantize_fp8_transposed_rows: weight 0 has no parts");
}

}  // namespace
}  // namespace cpf
