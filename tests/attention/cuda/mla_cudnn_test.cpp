// MLA shapes on cuDNN (d_qk != d_v): which backend `auto` picks for the MLA latent benchmark's one-GPU
// reference and its expanded-K/V calls (DeepSeek-V2-Lite: h 16, d_qk 192 = 128 + 64, d_v 128, bshd,
// causal, bf16; benchmarks/gpu/cp_mla_latent_bench.cpp), and cuDNN's results against the CPU reference
// for the small d_qk != d_v calls of KV-cache decoding (tests/tensor/cuda/gpt_kv_cache_test.cpp's MLA model):
// the full window (thd, 4 heads, d_qk 32 / d_v 16) and the cached step over the absorbed latent (thd,
// 4 query heads on 1 kv head, d_qk 48 / d_v 32, one new query per sequence at its cache position).
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "attention/attention_problem.h"
#include "attention/cuda/backend_selection.h"
#include "attention/nn/kv_cache.h"
#include "framework/tensor/ops/views.h"
#include "tests/attention/cuda/attention_gpu_support.h"

namespace cpf {
namespace {

using testing::close_to_reference;
using testing::on_cpu;
using testing::on_gpu;
using testing::random_cpu;

class MlaCudnn : public testing::CudaTest {
 protected:
  void SetUp() override {
    testing::CudaTest::SetUp();
    if (IsSkipped()) return;
    if (!attention_cuda::built_with_cudnn()) GTEST_SKIP() << "this build has no cuDNN (CPF_WITH_CUDNN=OFF)";
    if (const char* env = std::getenv("CPF_ATTENTION_BACKEND")) saved_ = env;
    unsetenv("CPF_ATTENTION_BACKEND");  // auto: the choice under test
  }
  void TearDown() override {
    if (saved_) setenv("CPF_ATTENTION_BACKEND", saved_->c_str(), 1);
  }

 private:
  std::optional<std::string> saved_;
};

// The benchmark's one-GPU call at n tokens: q, k (1, n, 16, 192), v (1, n, 16, 128). Selection reads
// shapes only, so the tensors are zero-stride views of one token (no n-sized allocation).
AttentionProblem lite_problem(int64_t n) {
  const Tensor qk = raw::expand(zeros({1, 1, 16, 192}, {.dtype = DType::bf16}), {1, n, 16, 192});
  const Tensor v = raw::expand(zeros({1, 1, 16, 128}, {.dtype = DType::bf16}), {1, n, 16, 128});
  return check_attention_inputs(qk, qk, v, {.mask = MaskType::causal}, std::nullopt, {});
}

// 32768 and 131072 tokens: the one-GPU references of 16k and 64k tokens per GPU on 2 GPUs; 16384 and
// 65536: a p2p step's block of one rank. Forward and backward (from out alone: no dlse) are cuDNN's.
TEST_F(MlaCudnn, AutoPicksCudnnForTheLatentBenchmarksExpandedCalls) {
  for (const int64_t n : {16384, 32768, 65536, 131072}) {
    const AttentionProblem p = lite_problem(n);
    EXPECT_EQ(attention_cuda::describe_selection(p, DType::bf16, false, false), "cudnn")
        << attention_cuda::describe_problem(p, DType::bf16, false);
    EXPECT_EQ(attention_cuda::describe_selection(p, DType::bf16, true, false), "cudnn")
        << attention_cuda::describe_problem(p, DType::bf16, true);
  }
}

// Forward on cuda:0 under auto (pinned to cuDNN) against the CPU reference.
void expect_forward_matches_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionSpec& spec,
                                const SequenceInfo& seq, const std::string& name) {
  const AttentionProblem p = check_attention_inputs(q, k, v, spec, seq, {});
  EXPECT_EQ(attention_cuda::describe_selection(p, DType::bf16, false, false), "cudnn")
      << name << ": " << attention_cuda::describe_problem(p, DType::bf16, false);
  const raw::AttentionForward want = raw::attention_forward(q, k, v, spec, seq);
  const raw::AttentionForward got = raw::attention_forward(on_gpu(q), on_gpu(k), on_gpu(v), spec, seq);
  EXPECT_TRUE(close_to_reference(got.out, want.out, testing::rtol_for(DType::bf16))) << name << ": out";
  EXPECT_TRUE(close_to_reference(got.lse, want.lse, 1e-4)) << name << ": lse";
}

// The full-window forward of the decoding test's MLA model: 3 packed windows, causal.
TEST_F(MlaCudnn, FullWindowDecodingShapeMatchesTheCpu) {
  const SequenceInfo seq = SequenceInfo::from_lengths({12, 7, 9});
  const Tensor q = random_cpu({28, 4, 32}, DType::bf16, 1);  // (T, H, nope + rope)
  const Tensor k = random_cpu({28, 4, 32}, DType::bf16, 2);
  const Tensor v = random_cpu({28, 4, 16}, DType::bf16, 3);  // (T, H, d_v)
  const AttentionSpec spec{.qkv_format = QkvFormat::thd, .mask = MaskType::causal, .softmax_scale = 0.125};
  expect_forward_matches_cpu(q, k, v, spec, seq, "full window");
}

// A cached step: one new query per sequence at positions 11, 3 and 0 of slots of capacity 12, keys
// [latent | k_pe] and values [latent] shared by the 4 query heads, the per-head form's scale.
TEST_F(MlaCudnn, CachedDecodingStepShapeMatchesTheCpu) {
  const nn::KVCacheStep step{.capacity = 12, .past = {11, 3, 0}, .new_tokens = {1, 1, 1}};
  const Tensor q = random_cpu({3, 4, 48}, DType::bf16, 4);   // (T_new, H, rank + rope)
  const Tensor k = random_cpu({36, 1, 48}, DType::bf16, 5);  // (S * capacity, 1, rank + rope)
  const Tensor v = random_cpu({36, 1, 32}, DType::bf16, 6);  // (S * capacity, 1, rank)
  const AttentionSpec spec{.qkv_format = QkvFormat::thd, .mask = MaskType::causal, .softmax_scale = 0.125};
  expect_forward_matches_cpu(q, k, v, spec, step.attention_info(), "cached step");
  // A prefill of the same slots (past 0): several queries per sequence, bottom-right aligned.
  const nn::KVCacheStep prefill{.capacity = 12, .past = {0, 0, 0}, .new_tokens = {5, 1, 3}};
  expect_forward_matches_cpu(random_cpu({9, 4, 48}, DType::bf16, 7), k, v, spec, prefill.attention_info(),
                             "cached prefill");
}

}  // namespace
}  // namespace cpf
