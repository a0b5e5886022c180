// Backend selection for CUDA attention (attention/cuda/backend_selection.h): the environment
// override, explicit requests, auto's choice and its log line, and the error texts. Selection alone
// touches no GPU except through cuDNN's probe, so the tests that only resolve requests run anywhere.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "attention/attention_problem.h"
#include "attention/cuda/backend_selection.h"
#include "framework/core/logging.h"
#include "tests/attention/attention_support.h"
#include "tests/attention/cuda/attention_gpu_support.h"

namespace cpf {
namespace {

using attention_cuda::describe_problem;
using attention_cuda::describe_selection;

// Sets CPF_ATTENTION_BACKEND for a scope (unset when value is null) and restores it.
class ScopedBackendEnv {
 public:
  explicit ScopedBackendEnv(const char* value) {
    if (const char* old = std::getenv("CPF_ATTENTION_BACKEND")) saved_ = old;
    if (value)
      setenv("CPF_ATTENTION_BACKEND", value, 1);
    else
      unsetenv("CPF_ATTENTION_BACKEND");
  }
  ~ScopedBackendEnv() {
    if (saved_)
      setenv("CPF_ATTENTION_BACKEND", saved_->c_str(), 1);
    else
      unsetenv("CPF_ATTENTION_BACKEND");
  }

 private:
  std::optional<std::string> saved_;
};

// A problem on CPU tensors of the given shape: selection reads only the problem and the dtype.
AttentionProblem problem(DType dtype, AttentionBackend backend, MaskType mask = MaskType::causal, int64_t d = 64) {
  const Tensor q = zeros({2, 128, 4, d}, {.dtype = dtype});
  return check_attention_inputs(q, q, q, {.mask = mask}, std::nullopt, {.backend = backend});
}

TEST(AttentionBackendSelection, ExplicitUnfusedIsAlwaysTaken) {
  const ScopedBackendEnv env(nullptr);
  EXPECT_EQ(describe_selection(problem(DType::bf16, AttentionBackend::unfused), DType::bf16, false, false),
            "unfused (requested by attention.backend: unfused)");
  EXPECT_EQ(describe_selection(problem(DType::f64, AttentionBackend::unfused), DType::f64, true, true),
            "unfused (requested by attention.backend: unfused)");
}

TEST(AttentionBackendSelection, EnvironmentOverridesTheConfig) {
  const ScopedBackendEnv env("unfused");
  EXPECT_EQ(describe_selection(problem(DType::bf16, AttentionBackend::cudnn), DType::bf16, false, false),
            "unfused (requested by CPF_ATTENTION_BACKEND=unfused)");
  EXPECT_EQ(attention_cuda::requested_backend(AttentionBackend::automatic), AttentionBackend::unfused);
}

TEST(AttentionBackendSelection, EmptyEnvironmentValueMeansUnset) {
  const ScopedBackendEnv env("");
  EXPECT_EQ(attention_cuda::requested_backend(AttentionBackend::unfused), AttentionBackend::unfused);
  EXPECT_EQ(attention_cuda::requested_backend(AttentionBackend::cudnn), AttentionBackend::cudnn);
}

TEST(AttentionBackendSelection, BadEnvironmentValueNamesTheVariable) {
  const ScopedBackendEnv env("fast");
  EXPECT_CPF_ERROR(attention_cuda::requested_backend(AttentionBackend::automatic),
                   "environment variable CPF_ATTENTION_BACKEND='fast' is not a valid attention backend: unknown "
                   "attention backend 'fast' (valid: auto, cudnn, unfused)");
  EXPECT_CPF_ERROR(describe_selection(problem(DType::f32, AttentionBackend::unfused), DType::f32, false, false),
                   "CPF_ATTENTION_BACKEND='fast'");
}

TEST(AttentionBackendSelection, DescribesTheProblem) {
  EXPECT_EQ(describe_problem(problem(DType::bf16, AttentionBackend::automatic), DType::bf16, false),
            "bf16, bshd, causal, b=2 hq=4 hkv=4 sq=128 skv=128 dqk=64 dv=64, forward");
  const Tensor q = zeros({10, 2, 8});
  const AttentionProblem thd = check_attention_inputs(q, q, q, {.qkv_format = QkvFormat::thd, .window = {3, 1}},
                                                      SequenceInfo::from_cu_seqlens({0, 4, 10}), {});
  EXPECT_EQ(describe_problem(thd, DType::f32, true),
            "f32, thd, window left=3 right=1, b=1 hq=2 hkv=2 sq=10 skv=10 dqk=8 dv=8 sequences=2, backward");
}

// cuDNN runs no f32 and no gradient on lse: explicit requests fail with the problem and the reason.
// Without cuDNN in the build (or loadable), the reason says that instead; the frame is the same.
TEST(AttentionBackendSelection, ExplicitCudnnOnAnUnsupportedCallIsAnError) {
  const ScopedBackendEnv env(nullptr);
  const AttentionProblem p = problem(DType::f32, AttentionBackend::cudnn);
  EXPECT_CPF_ERROR(describe_selection(p, DType::f32, false, false),
                   "attention: backend cudnn cannot run f32, bshd, causal, b=2 hq=4 hkv=4 sq=128 skv=128 dqk=64 "
                   "dv=64, forward: ");
  EXPECT_CPF_ERROR(describe_selection(p, DType::f32, false, false), "; use attention.backend: auto or unfused");
  const AttentionProblem bf = problem(DType::bf16, AttentionBackend::cudnn);
  EXPECT_CPF_ERROR(describe_selection(bf, DType::bf16, true, /*has_dlse=*/true),
                   "attention: backend cudnn cannot run bf16, bshd, causal");
}

TEST(AttentionBackendSelection, AutoFallsBackToUnfusedWithTheReason) {
  const ScopedBackendEnv env(nullptr);
  const std::string f32 =
      describe_selection(problem(DType::f32, AttentionBackend::automatic), DType::f32, false, false);
  EXPECT_EQ(f32.rfind("unfused (cuDNN: ", 0), 0u) << f32;
  EXPECT_GT(f32.size(), std::string("unfused (cuDNN: )").size()) << "the reason must not be empty: " << f32;
  const std::string dlse =
      describe_selection(problem(DType::bf16, AttentionBackend::automatic), DType::bf16, true, /*has_dlse=*/true);
  EXPECT_EQ(dlse.rfind("unfused (cuDNN: ", 0), 0u) << dlse;
  if (!attention_cuda::built_with_cudnn()) {
    EXPECT_EQ(f32, "unfused (cuDNN: this build has no cuDNN (CPF_WITH_CUDNN=OFF))");
  }
}

class AttentionBackendSelectionGpu : public testing::CudaTest {};

// On an H100/H200 with cuDNN 9.x a plain bf16 causal call is cuDNN's; the explicit request agrees.
TEST_F(AttentionBackendSelectionGpu, AutoPicksCudnnForAPlainBf16Call) {
  if (!attention_cuda::built_with_cudnn()) GTEST_SKIP() << "this build has no cuDNN (CPF_WITH_CUDNN=OFF)";
  const ScopedBackendEnv env(nullptr);
  const AttentionProblem p = problem(DType::bf16, AttentionBackend::automatic);
  EXPECT_EQ(describe_selection(p, DType::bf16, false, false), "cudnn");
  EXPECT_EQ(describe_selection(p, DType::bf16, true, false), "cudnn");
  AttentionProblem explicit_cudnn = p;
  explicit_cudnn.config.backend = AttentionBackend::cudnn;
  EXPECT_EQ(describe_selection(explicit_cudnn, DType::bf16, false, false), "cudnn");
}

// The choice is logged once per configuration, through the project's logging.
TEST_F(AttentionBackendSelectionGpu, LogsTheChoiceOncePerConfiguration) {
  const ScopedBackendEnv env(nullptr);
  set_log_level(LogLevel::info);
  const Tensor q = testing::on_gpu(testing::random_cpu({1, 8, 2, 8}, DType::f32, 1));
  const AttentionSpec spec{.mask = MaskType::causal};
  ::testing::internal::CaptureStderr();
  (void)raw::attention_forward(q, q, q, spec);
  (void)raw::attention_forward(q, q, q, spec);
  const std::string log = ::testing::internal::GetCapturedStderr();
  const std::string expected =
      "attention on cuda:0 (f32, bshd, causal, b=1 hq=2 hkv=2 sq=8 skv=8 dqk=8 dv=8, "
      "forward): unfused (cuDNN: ";
  const size_t first = log.find(expected);
  EXPECT_NE(first, std::string::npos) << "stderr was: " << log;
  EXPECT_EQ(log.find(expected, first + 1), std::string::npos) << "logged twice: " << log;
}

// An explicit cudnn request on an unsupported call fails at the call, before any work.
TEST_F(AttentionBackendSelectionGpu, ExplicitCudnnFailsAtTheCall) {
  const ScopedBackendEnv env(nullptr);
  const Tensor q = testing::on_gpu(testing::random_cpu({1, 8, 2, 8}, DType::f32, 2));
  EXPECT_CPF_ERROR(raw::attention_forward(q, q, q, {}, std::nullopt, {.backend = AttentionBackend::cudnn}),
                   "attention: backend cudnn cannot run f32, bshd, no mask");
}

// The environment override reaches real calls: unfused gives the CPU reference's results for bf16.
TEST_F(AttentionBackendSelectionGpu, EnvironmentOverrideRunsUnfused) {
  const ScopedBackendEnv env("unfused");
  const Tensor q = testing::random_cpu({2, 16, 2, 16}, DType::bf16, 3);
  const Tensor k = testing::random_cpu({2, 16, 2, 16}, DType::bf16, 4);
  const Tensor v = testing::random_cpu({2, 16, 2, 16}, DType::bf16, 5);
  const AttentionSpec spec{.mask = MaskType::causal};
  const AttentionKernelConfig cudnn_config{.backend = AttentionBackend::cudnn};  // overridden by the environment
  const raw::AttentionForward want = raw::attention_forward(q, k, v, spec);
  const raw::AttentionForward got =
      raw::attention_forward(testing::on_gpu(q), testing::on_gpu(k), testing::on_gpu(v), spec, {}, cudnn_config);
  EXPECT_TRUE(testing::close_to_reference(got.out, want.out, testing::rtol_for(DType::bf16))) << "out";
  EXPECT_TRUE(testing::close_to_reference(got.lse, want.lse, 1e-5)) << "lse";
}

}  // namespace
}  // namespace cpf
