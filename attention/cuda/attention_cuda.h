#pragma once
// Private to cpf_attention_cuda: the entry points registered as the cuda slot of
// raw::device_attention() (attention_backend.h). They pick cuDNN or the unfused kernels for each call
// (backend_selection.cpp) and run on the calling thread's current stream of q's device.
#include "attention/attention_op.h"
#include "attention/attention_problem.h"

namespace cpf::attention_cuda {

raw::AttentionForward forward(const AttentionProblem& p, const Tensor& q, const Tensor& k, const Tensor& v);
raw::AttentionGrads backward(const AttentionProblem& p, const Tensor& dout, const Tensor& dlse, const Tensor& q,
                             const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse);

}  // namespace cpf::attention_cuda
