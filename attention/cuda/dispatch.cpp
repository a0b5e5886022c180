// The CUDA attention entry points registered in register.cpp (attention_cuda.h): each call asks
// backend_selection which implementation runs it (cuDNN's fused SDPA or the unfused path) and
// forwards the call unchanged (to cuDNN as the selection prepared it, so the call is mapped once), with
// q's device current (so the cuDNN probe, handles and plans are made on that device even in rank
// threads that never called cudaSetDevice). The forward and the backward of one step choose
// independently: a backward with a gradient on lse runs unfused even when cuDNN ran the forward; both
// follow the same contract (attention_op.h), so their results combine.
#include "attention/cuda/attention_cuda.h"
#include "attention/cuda/backend_selection.h"
#include "attention/cuda/unfused_attention.h"
#include "framework/core/error.h"
#include "framework/tensor/cuda/runtime.cuh"
#include "framework/tensor/profile.h"
#if CPF_HAVE_CUDNN
#include "attention/cuda/cudnn/fused_attention.h"
#endif

namespace cpf::attention_cuda {
namespace {

// The choice, with the host time of making it (the cuDNN mapping and plan lookups) in its own scope.
BackendChoice selected(const AttentionProblem& p, DType dtype, bool backward, bool has_dlse, const Device& device) {
  const profile::Scope scope("attention/select_backend", Device::cpu());  // host time only
  return select_and_log_backend(p, dtype, backward, has_dlse, device);
}

}  // namespace

raw::AttentionForward forward(const AttentionProblem& p, const Tensor& q, const Tensor& k, const Tensor& v) {
  const cuda::DeviceGuard device_guard(q.device().index);
  const BackendChoice choice = selected(p, q.dtype(), /*backward=*/false, /*has_dlse=*/false, q.device());
#if CPF_HAVE_CUDNN
  if (choice.backend == AttentionBackend::cudnn) return cudnn::forward(*choice.cudnn_call, p, q, k, v);
#endif
  CPF_CHECK(choice.backend == AttentionBackend::unfused, "attention_forward: backend ",
            attention_backend_name(choice.backend), " is not in this build");
  return unfused::forward(p, q, k, v);
}

raw::AttentionGrads backward(const AttentionProblem& p, const Tensor& dout, const Tensor& dlse, const Tensor& q,
                             const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse) {
  const cuda::DeviceGuard device_guard(q.device().index);
  const BackendChoice choice = selected(p, q.dtype(), /*backward=*/true, dlse.defined(), q.device());
#if CPF_HAVE_CUDNN
  // cuDNN's backward takes no dlse: selection only picks it when dlse is undefined.
  if (choice.backend == AttentionBackend::cudnn) return cudnn::backward(*choice.cudnn_call, p, dout, q, k, v, out, lse);
#endif
  CPF_CHECK(choice.backend == AttentionBackend::unfused, "attention_backward: backend ",
            attention_backend_name(choice.backend), " is not in this build");
  return unfused::backward(p, dout, dlse, q, k, v, out, lse);
}

}  // namespace cpf::attention_cuda
