#pragma once
// Which kernels run an attention call on a CUDA tensor: cuDNN's fused SDPA or the unfused path.
//
// The request is AttentionKernelConfig::backend (config key attention.backend), overridden by the environment
// variable CPF_ATTENTION_BACKEND (auto | cudnn | unfused; a bad value is an error naming the
// variable). Then:
//   unfused  always runs (it supports everything the CPU reference does);
//   cudnn    runs when cuDNN can run the call, else cpf::Error
//            "attention: backend cudnn cannot run <problem>: <reason>; use attention.backend: auto or unfused";
//            a build without cuDNN says "this build has no cuDNN (CPF_WITH_CUDNN=OFF)";
//   auto     cuDNN when it can run the call, else unfused. The choice and the reason for rejecting
//            cuDNN are logged once per configuration (dtype, layout, mask, heads, dims, direction):
//            "[cpformer info] attention on cuda:0 (bf16, bshd, causal, b=2 hq=16 ...): cudnn"
//            "[cpformer info] attention on cuda:0 (f32, ...): unfused (cuDNN: f32 inputs)"
// Header without CUDA.
#include <memory>
#include <string>

#include "attention/attention_backend.h"
#include "attention/attention_problem.h"
#include "framework/tensor/device.h"

namespace cpf::attention_cuda {
namespace cudnn {
struct PreparedCall;  // attention/cuda/cudnn/fused_attention.h
}

inline constexpr const char* kBackendEnvVar = "CPF_ATTENTION_BACKEND";

// The requested backend: CPF_ATTENTION_BACKEND when set and not empty, else `configured`.
AttentionBackend requested_backend(AttentionBackend configured);

struct BackendChoice {
  AttentionBackend backend = AttentionBackend::unfused;  // cudnn or unfused, never automatic
  std::string why;  // "" for cuDNN; for unfused "cuDNN: <reason>" or "requested by ..."
  // For cuDNN: the call as the check mapped and probed it, which cudnn::forward/backward run without
  // mapping it again. Null otherwise.
  std::shared_ptr<const cudnn::PreparedCall> cudnn_call;
};

// Resolves the request for one call (throws as described above). Does not log.
BackendChoice select_backend(const AttentionProblem& p, DType dtype, bool backward, bool has_dlse);

// select_backend, and the log line the first time its configuration is seen. `device` only names
// the device in the log.
BackendChoice select_and_log_backend(const AttentionProblem& p, DType dtype, bool backward, bool has_dlse,
                                     const Device& device);

// Whether this build has the cuDNN path (CPF_WITH_CUDNN=ON and cuDNN found at configure time).
bool built_with_cudnn();

// The call in words: "bf16, bshd, causal, b=2 hq=16 hkv=16 sq=4096 skv=4096 dqk=128 dv=128, forward".
std::string describe_problem(const AttentionProblem& p, DType dtype, bool backward);

// The choice in words: "cudnn", "unfused (cuDNN: <reason>)" or "unfused (requested by ...)".
std::string describe_selection(const AttentionProblem& p, DType dtype, bool backward, bool has_dlse);

}  // namespace cpf::attention_cuda
