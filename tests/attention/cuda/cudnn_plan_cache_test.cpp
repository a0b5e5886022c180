// cuDNN's plan cache (attention/cuda/cudnn/fused_attention.h, plan_cache_stats): plans are keyed by shapes and
// options, so calls that differ only in what a CP ring or a varlen batch changes from call to call
// (the tensors' addresses, the sequence lengths under one 128-token quantum, position offsets that
// shift the causal diagonal, a sink's values) reuse the thread's plan instead of building one (0.1-1 s
// each). A key that changed per call would make every such call build (the first suspect for the CP
// NCCL test running 10 of its 20 p2p cases in 120 s once its sink and explicit-position cases came).
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "attention/attention_problem.h"
#include "attention/cuda/backend_selection.h"
#include "attention/cuda/cudnn/fused_attention.h"
#include "tests/attention/cuda/attention_gpu_support.h"

namespace cpf {
namespace {

using testing::on_gpu;
using testing::random_cpu;

class CudnnPlanCache : public testing::CudaTest {
 protected:
  void SetUp() override {
    testing::CudaTest::SetUp();
    if (IsSkipped()) return;
    if (!attention_cuda::built_with_cudnn()) GTEST_SKIP() << "this build has no cuDNN (CPF_WITH_CUDNN=OFF)";
    if (const char* env = std::getenv("CPF_ATTENTION_BACKEND")) saved_ = env;
    unsetenv("CPF_ATTENTION_BACKEND");
  }
  void TearDown() override {
    if (saved_) setenv("CPF_ATTENTION_BACKEND", saved_->c_str(), 1);
  }

  // Forward and backward (from out alone) on cuda:0 with fresh tensors (new addresses every call);
  // explicit cuDNN, so a call it cannot take fails instead of going unfused.
  static void run(const Shape& q_shape, const Shape& kv_shape, const AttentionSpec& spec,
                  const std::optional<SequenceInfo>& seq, uint64_t seed) {
    const Tensor q = on_gpu(random_cpu(q_shape, DType::bf16, seed));
    const Tensor k = on_gpu(random_cpu(kv_shape, DType::bf16, seed + 1));
    const Tensor v = on_gpu(random_cpu(kv_shape, DType::bf16, seed + 2));
    const AttentionKernelConfig cudnn{.backend = AttentionBackend::cudnn};
    const raw::AttentionForward f = raw::attention_forward(q, k, v, spec, seq, cudnn);
    (void)raw::attention_backward(on_gpu(random_cpu(q_shape, DType::bf16, seed + 3)), Tensor(), q, k, v, f.out, f.lse,
                                  spec, seq, cudnn);
  }

 private:
  std::optional<std::string> saved_;
};

// Runs `calls` (each differs from the first only in values); the first may build, the rest must not.
template <class Call>
void expect_one_build_per_key(const char* what, int calls, Call&& call) {
  call(0);
  const attention_cuda::cudnn::PlanCacheStats first = attention_cuda::cudnn::plan_cache_stats();
  for (int i = 1; i < calls; ++i) call(i);
  const attention_cuda::cudnn::PlanCacheStats after = attention_cuda::cudnn::plan_cache_stats();
  EXPECT_EQ(after.builds, first.builds) << what << ": " << after.builds - first.builds << " plans built by "
                                        << calls - 1 << " calls of the same shapes";
  EXPECT_GE(after.hits, first.hits + 2 * (calls - 1)) << what;  // forward and backward each hit
}

TEST_F(CudnnPlanCache, SameShapesReuseTheThreadsPlans) {
  const AttentionSpec causal_thd{.qkv_format = QkvFormat::thd, .mask = MaskType::causal};
  expect_one_build_per_key("thd lengths within one quantum", 4, [&](int i) {
    const std::vector<std::vector<int64_t>> lengths{{50, 70}, {60, 60}, {10, 110}, {100, 20}};
    run({120, 4, 64}, {120, 4, 64}, causal_thd, SequenceInfo::from_lengths(lengths[static_cast<size_t>(i)]), 10 + i);
  });
  const AttentionSpec causal{.mask = MaskType::causal};
  expect_one_build_per_key("bshd query offsets (a ring tile's shifted diagonal)", 3, [&](int i) {
    // Queries 64, 96 or 128 positions ahead of the keys: right = offset, the same key (r is by value).
    const int64_t ahead = 64 + 32 * i;
    run({2, 128, 4, 64}, {2, 256, 4, 64}, causal,
        SequenceInfo::from_lengths({128, 128}, {256, 256}, 128, 256).with_position_offsets(ahead, 0), 20 + i);
  });
  expect_one_build_per_key("bshd padding lengths", 3, [&](int i) {
    run({2, 128, 4, 64}, {2, 128, 4, 64}, {.mask = MaskType::padding_causal},
        SequenceInfo::from_lengths({128, 77 - 10 * i}, 128), 30 + i);
  });
}

TEST_F(CudnnPlanCache, SinkValuesDoNotChangeTheKey) {
  expect_one_build_per_key("sink values", 3, [&](int i) {
    AttentionSpec spec{.mask = MaskType::causal};
    spec.sink = on_gpu(random_cpu({4}, DType::f32, 40 + static_cast<uint64_t>(i)));
    run({1, 128, 4, 64}, {1, 128, 4, 64}, spec, std::nullopt, 50 + i);
  });
}

}  // namespace
}  // namespace cpf
