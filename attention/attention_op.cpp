#include "attention/attention_op.h"

#include <algorithm>
#include <limits>

#include "attention/attention_sink.h"
#include "attention/cpu/flash_kernels.h"
#include "framework/core/error.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/profile.h"

namespace cpf::raw {
namespace {

// The (query, key) pairs the mask lets through: per query, the keys of its sequence whose positions lie
// in the window (causal: right = 0). Positions ascend within a sequence's storage (dual-chunk CP shards
// included), so each query's count is two binary searches.
double visible_pairs(const AttentionProblem& p) {
  double pairs = 0;
  for (const AttentionSequence& s : p.sequences) {
    if (s.q_len == 0 || s.kv_len == 0) continue;
    const auto first = p.kv_pos.begin() + s.kv_token, last = first + s.kv_len;
    for (int64_t i = 0; i < s.q_len; ++i) {
      const int64_t at = p.q_pos[static_cast<size_t>(s.q_token + i)];
      const auto lo = p.window.left < 0 ? first : std::lower_bound(first, last, at - p.window.left);
      const auto hi = p.window.right < 0 ? last : std::upper_bound(first, last, at + p.window.right);
      if (hi > lo) pairs += static_cast<double>(hi - lo);
    }
  }
  return pairs;
}

// The profiler's work of one call (profile::add_work): 2 x pairs x heads x (d_qk + d_v) forward; the
// backward recomputes the scores and multiplies four more times, 2 x pairs x heads x (3 d_qk + 2 d_v).
void report_attention_work(const AttentionProblem& p, bool backward, double bytes) {
  if (!profile::enabled()) return;
  const double per_pair = backward ? 3.0 * static_cast<double>(p.d_qk) + 2.0 * static_cast<double>(p.d_v)
                                   : static_cast<double>(p.d_qk + p.d_v);
  profile::add_work(2.0 * visible_pairs(p) * static_cast<double>(p.h_q) * per_pair, bytes);
}

// f64 stays f64 (gradcheck); f32 and bf16 compute in f32.
DType compute_dtype(DType dtype) { return dtype == DType::f64 ? DType::f64 : DType::f32; }

Tensor prepare(const Tensor& t, DType dtype) { return raw::contiguous(raw::to(t, dtype)); }

void check_same_shape(const Tensor& t, const Shape& expected, const char* name, const char* expected_name,
                      const Device& device) {
  CPF_CHECK(t.defined(), "attention_backward: ", name, " is undefined");
  CPF_CHECK(t.shape() == expected, "attention_backward: ", name, " must have ", expected_name, "'s shape ", expected,
            ": ", name, "=", t.shape());
  CPF_CHECK(is_floating(t.dtype()) && t.device() == device, "attention_backward: ", name,
            " must be a floating-point tensor on q's device ", device, ": ", t.dtype(), " on ", t.device());
}

// nullptr for CPU tensors (the flash kernels below); the registered kernels of any other device.
const DeviceAttentionKernels* device_kernels(const Device& device, const char* op) {
  if (device.is_cpu()) return nullptr;
  const DeviceAttentionKernels* kernels = device_attention(device.type);
  CPF_CHECK(kernels, op, ": no attention kernels for ", device,
            " in this build (they come with cpf_attention_cuda: configure with CPF_WITH_CUDA=ON and link it)");
  return kernels;
}

// The kernels' result with the sink in every row's denominator (attention_sink.h), when the spec has one.
AttentionForward with_sink(AttentionForward forward, const AttentionSpec& spec) {
  if (!spec.sink.defined() || forward.sink_applied) return forward;
  SinkRescaled rescaled = apply_attention_sink(forward.out, forward.lse, spec.sink, spec.qkv_format);
  return {rescaled.out, rescaled.lse, forward.tiles, true};
}

// dq/dk/dv from the kernels plus d(sink): out and lse already hold the sink, so the kernels need nothing.
AttentionGrads with_sink_grad(AttentionGrads grads, const Tensor& dout, const Tensor& dlse, const Tensor& out,
                              const Tensor& lse, const AttentionSpec& spec) {
  if (spec.sink.defined()) grads.dsink = attention_sink_grad(dout, dlse, out, lse, spec.sink, spec.qkv_format);
  return grads;
}

}  // namespace

AttentionForward attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionSpec& spec,
                                   const std::optional<SequenceInfo>& seq, const AttentionKernelConfig& config) {
  // Nested scopes split a call's time into the host checks (sequence tables, positions) and the device
  // entry (backend choice, cuDNN mapping, kernels): a GPU time far above the kernels' says the stream
  // ran dry while the host prepared the call. The checks queue no GPU work: host time only (no events).
  const AttentionProblem p = [&] {
    const profile::Scope scope("attention/check_inputs", Device::cpu());
    return check_attention_inputs(q, k, v, spec, seq, config);
  }();
  // Reads q, k, v; writes out (q's rows with d_v wide heads).
  const double out_bytes =
      profile::tensor_bytes(q) * static_cast<double>(p.d_v) / static_cast<double>(std::max<int64_t>(p.d_qk, 1));
  report_attention_work(p, false,
                        profile::tensor_bytes(q) + profile::tensor_bytes(k) + profile::tensor_bytes(v) + out_bytes);
  if (const DeviceAttentionKernels* device = device_kernels(q.device(), "attention_forward")) {
    const profile::Scope scope("attention/device_forward", q.device());
    return with_sink(device->forward(p, q, k, v), spec);
  }
  const DType ct = compute_dtype(q.dtype());
  const Tensor qc = prepare(q, ct), kc = prepare(k, ct), vc = prepare(v, ct);
  Tensor out = zeros(p.out_shape(), {.dtype = ct});
  Tensor lse = full(p.lse_shape(), -std::numeric_limits<double>::infinity(), {.dtype = ct});
  const TileStats stats = visit_compute_dtype(ct, "attention_forward", [&]<class T>() {
    return attention_cpu::flash_forward<T>(p, qc.data<T>(), kc.data<T>(), vc.data<T>(), out.data<T>(), lse.data<T>());
  });
  return with_sink({raw::to(out, q.dtype()), lse, stats, false}, spec);
}

AttentionGrads attention_backward(const Tensor& dout, const Tensor& dlse, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& out, const Tensor& lse, const AttentionSpec& spec,
                                  const std::optional<SequenceInfo>& seq, const AttentionKernelConfig& config) {
  // The forward's scopes, for the backward: host checks, then the device entry.
  const AttentionProblem p = [&] {
    const profile::Scope scope("attention/check_inputs", Device::cpu());
    AttentionProblem checked = check_attention_inputs(q, k, v, spec, seq, config);
    check_same_shape(out, checked.out_shape(), "out", "the attention output", q.device());
    check_same_shape(dout, checked.out_shape(), "dout", "the attention output", q.device());
    check_same_shape(lse, checked.lse_shape(), "lse", "the log-sum-exp", q.device());
    if (dlse.defined()) check_same_shape(dlse, checked.lse_shape(), "dlse", "the log-sum-exp", q.device());
    return checked;
  }();
  report_attention_work(p, true,
                        2 * (profile::tensor_bytes(q) + profile::tensor_bytes(k) + profile::tensor_bytes(v)) +
                            profile::tensor_bytes(out) + profile::tensor_bytes(dout) + profile::tensor_bytes(lse));
  if (const DeviceAttentionKernels* device = device_kernels(q.device(), "attention_backward")) {
    const profile::Scope scope("attention/device_backward", q.device());
    return with_sink_grad(device->backward(p, dout, dlse, q, k, v, out, lse), dout, dlse, out, lse, spec);
  }
  const DType ct = compute_dtype(q.dtype());
  const Tensor qc = prepare(q, ct), kc = prepare(k, ct), vc = prepare(v, ct);
  const Tensor oc = prepare(out, ct), doc = prepare(dout, ct), lc = prepare(lse, ct);
  const Tensor dlc = dlse.defined() ? prepare(dlse, ct) : Tensor();
  Tensor dq = zeros(q.shape(), {.dtype = ct}), dk = zeros(k.shape(), {.dtype = ct}),
         dv = zeros(v.shape(), {.dtype = ct});
  const TileStats stats = visit_compute_dtype(ct, "attention_backward", [&]<class T>() {
    return attention_cpu::flash_backward<T>(p, qc.data<T>(), kc.data<T>(), vc.data<T>(), oc.data<T>(), doc.data<T>(),
                                            lc.data<T>(), dlc.defined() ? dlc.data<T>() : nullptr, dq.data<T>(),
                                            dk.data<T>(), dv.data<T>());
  });
  return with_sink_grad({raw::to(dq, q.dtype()), raw::to(dk, k.dtype()), raw::to(dv, v.dtype()), stats, {}}, dout, dlse,
                        out, lse, spec);
}

}  // namespace cpf::raw
