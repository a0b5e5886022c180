// Many weights cast to FP8 in one launch on the GPU (framework/tensor/cuda/fp8_rows.cu behind
// framework/tensor/ops/fp8_rows.h): against the per-weight GPU ops on the concatenation bit for bit, and
// against the CPU (the same ops, one weight at a time) exactly, since a cast is one rounded product per
// element. The weights mix row blocks (linear_cat's parts), f32 and bf16, shapes the kernel does not take
// (cast one by one) and more blocks than one launch holds; the FP8 weight cache's refresh on the GPU gives
// the copies a call would cast.
#include "framework/tensor/ops/fp8_rows.h"

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "cuda_test_utils.h"
#include "framework/autograd/fp8_weight_cache.h"
#include "framework/autograd/functions/fp8_linear.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/join.h"

namespace cpf {
namespace {

using testing::on_cpu;
using testing::on_gpu;
using testing::random_cpu;
using testing::same_bytes;

class CudaFp8RowsTest : public testing::CudaTest {};

Tensor scalar_on(float v, Device device) { return raw::to(from_vector(std::vector<float>{v}, {}), device); }

// Row blocks of weights: (rows of each part, width, dtype). 20 weights of up to 3 parts: 52 blocks, more
// than one launch's 48; {48, 16} x 80 and 96 x 40 do not fit the 64 x 64 tiles and are cast one by one.
std::vector<std::vector<Tensor>> weights_on_cpu() {
  const std::vector<std::tuple<std::vector<int64_t>, int64_t, DType>> shapes = {
      {{128, 64, 64}, 128, DType::f32}, {{256}, 192, DType::f32}, {{64, 64}, 64, DType::bf16},
      {{48, 16}, 80, DType::f32},       {{96}, 40, DType::bf16},  {{192, 64, 64}, 256, DType::f32},
  };
  std::vector<std::vector<Tensor>> weights;
  uint64_t seed = 3;
  for (int copy = 0; copy < 4; ++copy) {
    for (const auto& [rows, width, dtype] : shapes) {
      std::vector<Tensor> parts;
      for (int64_t r : rows) parts.push_back(random_cpu({r, width}, dtype, seed++, -2.0, 2.0));
      weights.push_back(std::move(parts));
    }
  }
  return weights;
}

std::vector<std::vector<Tensor>> to_gpu(const std::vector<std::vector<Tensor>>& weights) {
  std::vector<std::vector<Tensor>> out;
  for (const auto& parts : weights) {
    std::vector<Tensor> moved;
    for (const Tensor& p : parts) moved.push_back(on_gpu(p));
    out.push_back(std::move(moved));
  }
  return out;
}

TEST_F(CudaFp8RowsTest, AmaxesEqualThePerWeightOpsAndTheCpu) {
  const auto cpu = weights_on_cpu();
  const auto gpu = to_gpu(cpu);
  const std::vector<Tensor> amax_gpu = raw::abs_max_rows(gpu), amax_cpu = raw::abs_max_rows(cpu);
  ASSERT_EQ(amax_gpu.size(), gpu.size());
  for (size_t i = 0; i < gpu.size(); ++i) {
    EXPECT_EQ(on_cpu(amax_gpu[i]).item<float>(), on_cpu(raw::abs_max(raw::cat(gpu[i], 0))).item<float>()) << i;
    EXPECT_EQ(on_cpu(amax_gpu[i]).item<float>(), amax_cpu[i].item<float>()) << i;
  }
}

TEST_F(CudaFp8RowsTest, CastsEqualThePerWeightOpsAndTheCpuBitForBit) {
  const auto cpu = weights_on_cpu();
  const auto gpu = to_gpu(cpu);
  std::vector<raw::Fp8RowsCast> casts_gpu, casts_cpu;
  std::vector<Tensor> running_ref;
  for (size_t i = 0; i < gpu.size(); ++i) {
    const float scale = 448.0f / 2.0f * (i % 3 == 0 ? 4.0f : 0.5f);  // some saturate
    const bool record = i % 2 == 0;
    casts_gpu.push_back(
        {gpu[i], scalar_on(scale, gpu[i][0].device()), record ? scalar_on(0.25f, gpu[i][0].device()) : Tensor()});
    casts_cpu.push_back({cpu[i], scalar_on(scale, Device::cpu()), record ? scalar_on(0.25f, Device::cpu()) : Tensor()});
    running_ref.push_back(record ? scalar_on(0.25f, gpu[i][0].device()) : Tensor());
  }
  const auto got = raw::quantize_fp8_transposed_rows(casts_gpu, DType::f8e4m3);
  const auto cpu_got = raw::quantize_fp8_transposed_rows(casts_cpu, DType::f8e4m3);
  for (size_t i = 0; i < gpu.size(); ++i) {
    const raw::Fp8Transposed ref =
        raw::quantize_fp8_transposed(raw::cat(gpu[i], 0), casts_gpu[i].scale, DType::f8e4m3, running_ref[i]);
    const std::string what = "weight " + std::to_string(i);
    EXPECT_TRUE(same_bytes(got[i].q, ref.q)) << what;
    EXPECT_TRUE(same_bytes(got[i].qt, ref.qt)) << what;
    EXPECT_TRUE(same_bytes(got[i].q, cpu_got[i].q)) << what;
    EXPECT_TRUE(same_bytes(got[i].qt, cpu_got[i].qt)) << what;
    if (running_ref[i].defined()) {
      EXPECT_EQ(on_cpu(casts_gpu[i].amax_out).item<float>(), on_cpu(running_ref[i]).item<float>()) << what;
      EXPECT_EQ(on_cpu(casts_gpu[i].amax_out).item<float>(), casts_cpu[i].amax_out.item<float>()) << what;
    }
  }
}

// The cache's second step casts every weight in one refresh; the copies are those a call casts itself.
TEST_F(CudaFp8RowsTest, RefreshedCopiesEqualACallsOwnCast) {
  const auto gpu = to_gpu(weights_on_cpu());
  Fp8WeightCache cache;
  const Fp8LinearOptions options{.margin = 1, .weight_cache = &cache};
  for (int step = 0; step < 2; ++step) {
    const Fp8WeightCache::StepScope scope(&cache);
    for (const auto& parts : gpu) {
      if (!cache.find(parts, options).data.defined()) {
        const Tensor w = raw::cat(parts, 0);
        const Tensor scale = raw::fp8_scale(raw::abs_max(w), DType::f8e4m3, 1);
        const raw::Fp8Transposed c = raw::quantize_fp8_transposed(w, scale, DType::f8e4m3);
        cache.store(parts, options, {c.q, c.qt, raw::unary(raw::UnaryOp::reciprocal, scale)});
      }
    }
  }
  EXPECT_EQ(cache.refreshed(), static_cast<int64_t>(gpu.size()));
  const Fp8WeightCache::StepScope scope(&cache);
  for (const auto& parts : gpu) {
    const Fp8WeightCopy kept = cache.find(parts, options);
    ASSERT_TRUE(kept.data.defined());
    const Tensor w = raw::cat(parts, 0);
    const Tensor scale = raw::fp8_scale(raw::abs_max(w), DType::f8e4m3, 1);
    const raw::Fp8Transposed c = raw::quantize_fp8_transposed(w, scale, DType::f8e4m3);
    EXPECT_TRUE(same_bytes(kept.data, c.q));
    EXPECT_TRUE(same_bytes(kept.transpose, c.qt));
    EXPECT_TRUE(same_bytes(kept.scale_inv, raw::unary(raw::UnaryOp::reciprocal, scale)));
  }
}

// A plan made on the CPU (a model moved to the GPU since) is not cast by a step whose calls run on the GPU.
TEST_F(CudaFp8RowsTest, ARefreshCastsOnlyTheWeightsOnTheStepsDevice) {
  const auto cpu = weights_on_cpu();
  const auto gpu = to_gpu(cpu);
  Fp8WeightCache cache;
  const Fp8LinearOptions options{.weight_cache = &cache};
  for (const auto* weights : {&cpu, &gpu}) {
    const Fp8WeightCache::StepScope scope(&cache);
    for (const auto& parts : *weights) {
      if (cache.find(parts, options).data.defined()) continue;
      const Tensor w = raw::cat(parts, 0);
      const Tensor scale = raw::fp8_scale(raw::abs_max(w), DType::f8e4m3);
      const raw::Fp8Transposed c = raw::quantize_fp8_transposed(w, scale, DType::f8e4m3);
      cache.store(parts, options, {c.q, c.qt, raw::unary(raw::UnaryOp::reciprocal, scale)});
    }
  }
  EXPECT_EQ(cache.refreshed(), 0) << "the CPU plan was cast for a GPU step";
  EXPECT_EQ(cache.planned(), static_cast<int64_t>(gpu.size()));
}

}  // namespace
}  // namespace cpf
