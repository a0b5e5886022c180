#pragma once
// cuDNN's fused flash attention (SDPA) for CUDA tensors, through the raw cuDNN backend graph API (no
// cudnn-frontend). The dispatcher (attention/cuda/dispatch.cpp) asks unsupported_reason() first and
// runs the unfused path for anything cuDNN cannot express; forward/backward then follow the contract
// of attention/attention_op.h exactly (out in q's dtype, lse f32 (B, Hq, Sq) or (Hq, T) for thd,
// -inf lse and 0 out/dq/dk/dv at padded storage and at rows whose keys are all masked).
//
// How a call maps onto cuDNN (docs/attention.md, "GPU attention: cuDNN"): cuDNN's masks are index
// based, the problem's are position based. A call is expressible when every sequence's positions are
// contiguous runs (q0 .. q0+len-1, k0 .. k0+len-1) whose offsets q0 - k0 are equal for all sequences
// (top-left band with a shifted diagonal) or equal after bottom-right alignment. bshd/sbhd go in
// through strides, thd through ragged offsets. Plans are built once per shape/options key and cached
// per thread (a plan is bound to the cuDNN handle it was built with; handles are per device and
// thread and follow the thread's current stream).
//
// Header without CUDA or cuDNN: everything cuDNN-specific stays in the cudnn_*.cpp files.
#include <cstdint>
#include <memory>
#include <string>

#include "attention/attention_op.h"
#include "attention/attention_problem.h"
#include "framework/tensor/tensor.h"

namespace cpf::attention_cuda::cudnn {

// cudnnGetVersion() of the loaded library (e.g. 91900), 0 if cuDNN cannot be loaded/initialised.
int64_t runtime_version();

// This thread's plan cache since it started: plans built (a failed build counts; a key another thread
// found unbuildable does not), the seconds they took, and lookups served from the cache. Plans are
// keyed by shapes and options only (SdpaGraphKey), never by lengths' values or pointers, so a run of
// repeated shapes builds each plan once per thread (tests/attention/cuda/cudnn_plan_cache_test.cpp).
struct PlanCacheStats {
  int64_t builds = 0, hits = 0;
  double build_seconds = 0;
};
PlanCacheStats plan_cache_stats();

// "" when cuDNN can run this call, else a one-line reason. Static checks first (dtype, head dims,
// known-bad versions, whether the positions fit cuDNN's index-based masks), then a probe: the
// execution plan for this call's key is built (and cached); a failure names cuDNN's last error.
std::string unsupported_reason(const AttentionProblem& p, DType dtype, bool backward, bool has_dlse);

// One call checked, mapped onto cuDNN and probed, as unsupported_reason does it, kept so that the
// dispatcher (backend_selection, then forward/backward) maps each call once: the mapping walks every
// sequence and, for explicit positions, every token. `reason` is "" when cuDNN runs the call. Prepared
// on the thread's current device (the dispatcher makes q's device current).
struct PreparedCall;
std::shared_ptr<const PreparedCall> prepare_call(const AttentionProblem& p, DType dtype, bool backward, bool has_dlse);
const std::string& prepared_reason(const PreparedCall& call);

// Throw cpf::Error with the reason when unsupported_reason() is not empty. p.config.deterministic
// selects the deterministic backward (dQ written directly; O(b h s_q s_kv) workspace).
raw::AttentionForward forward(const AttentionProblem& p, const Tensor& q, const Tensor& k, const Tensor& v);
raw::AttentionGrads backward(const AttentionProblem& p, const Tensor& dout, const Tensor& q, const Tensor& k,
                             const Tensor& v, const Tensor& out, const Tensor& lse);
// The same with a call prepare_call made for `p` (prepared again when it was made for another device
// than q's); a call with a reason throws it.
raw::AttentionForward forward(const PreparedCall& call, const AttentionProblem& p, const Tensor& q, const Tensor& k,
                              const Tensor& v);
raw::AttentionGrads backward(const PreparedCall& call, const AttentionProblem& p, const Tensor& dout, const Tensor& q,
                             const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse);

}  // namespace cpf::attention_cuda::cudnn
