#include "attention/cuda/cudnn/tensor_placement.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "framework/tensor/ops/copy.h"
#include "framework/tensor/profile.h"

namespace cpf::attention_cuda::cudnn {
namespace {

Placed copied_inputs(const SdpaGraphKey& key, const Layouts& dense_layouts, const ExecutionPlan& plan, const Tensor& q,
                     const Tensor& k, const Tensor& v) {
  const bool as_is =
      q.is_contiguous() && k.is_contiguous() && v.is_contiguous() && k.dtype() == q.dtype() && v.dtype() == q.dtype();
  std::optional<profile::Scope> scope;  // the copies' GPU time, when there are any
  if (!as_is) scope.emplace("attention/cudnn_copy_inputs", q.device());
  return {key, dense_layouts, &plan, dense(q, q.dtype()), dense(k, q.dtype()), dense(v, q.dtype()), {}};
}

}  // namespace

void set_layouts(SdpaGraphKey& k, const AttentionProblem& p, const SdpaMapping& m, const Layouts& l) {
  k.q = l.q.strides;
  k.k = l.k.strides;
  k.v = l.v.strides;
  k.o = l.o.strides;
  if (!m.ragged) return;
  k.q[0] = m.s_q * l.q.row_stride;
  k.k[0] = m.s_kv * l.k.row_stride;
  k.v[0] = m.s_kv * l.v.row_stride;
  k.o[0] = m.s_q * l.o.row_stride;
  const int64_t largest =
      std::max({p.s_q * l.q.row_stride, p.s_kv * l.k.row_stride, p.s_kv * l.v.row_stride, p.s_q * l.o.row_stride});
  k.ragged_int64 = largest > std::numeric_limits<int32_t>::max();
}

Tensor dense(const Tensor& t, DType dtype) {
  Tensor c = raw::contiguous(raw::to(t, dtype));
  if (reinterpret_cast<uintptr_t>(c.raw_data()) % 16 != 0) c = raw::clone(c);
  return c;
}

Placed place_inputs(const SdpaGraphKey& key, const Layouts& dense_layouts, const SdpaMapping& m,
                    const ExecutionPlan& plan, const AttentionProblem& p, const Tensor& q, const Tensor& k,
                    const Tensor& v, const PlanLookup& lookup) {
  auto layout = [&](const Tensor& t) {
    return t.dtype() == q.dtype() ? in_place_layout(t, p.format) : std::optional<IoLayout>();
  };
  const std::optional<IoLayout> lq = layout(q), lk = layout(k), lv = layout(v);
  auto copied = [&] { return copied_inputs(key, dense_layouts, plan, q, k, v); };
  Placed r{key, dense_layouts, &plan, q, k, v, {}};
  if (key.backward) {
    if (!lq || !lk || !lv) return copied();
    r.grads = packed_gradients(q, k, v);
    if (!r.grads) return copied();
    for (const Tensor& g : *r.grads) {  // mirrors of q/k/v: the same strides and 16-byte alignment
      if (!in_place_layout(g, p.format)) return copied();
    }
  }
  {
    std::optional<profile::Scope> scope;  // forward: the copies of views cuDNN cannot read as they are
    if (!lq || !lk || !lv) scope.emplace("attention/cudnn_copy_inputs", q.device());
    if (!lq) r.q = dense(q, q.dtype());
    if (!lk) r.k = dense(k, q.dtype());
    if (!lv) r.v = dense(v, q.dtype());
  }
  r.layouts = {lq.value_or(dense_layouts.q), lk.value_or(dense_layouts.k), lv.value_or(dense_layouts.v),
               dense_layouts.o};
  set_layouts(r.key, p, m, r.layouts);
  if (r.key == key) return r;
  r.plan = lookup(r.key);  // strides are part of the key: one plan per layout
  return r.plan != nullptr ? r : copied();
}

}  // namespace cpf::attention_cuda::cudnn
