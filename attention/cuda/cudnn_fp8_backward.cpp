#include "attention/cuda/cudnn_fp8_backward.h"

#include <limits>

#include "framework/tensor/shape_utils.h"
#if CPF_HAVE_CUDNN
#include "attention/cuda/cudnn/graph_building.h"
#include "attention/cuda/cudnn/plan_cache.h"
#include "attention/cuda/cudnn/variant_pack.h"
#endif

namespace cpf::attention_cuda {
namespace {

constexpr const char* kOp = "cudnn_fp8_attention_backward";

void check_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& d_out,
                  const Tensor& stats, const Fp8AttentionBackwardScales& s) {
  for (const Tensor* t : {&q, &k, &v, &out, &d_out}) {
    check_defined(*t, kOp, "q, k, v, out and d_out");
    const bool type_ok = t == &d_out ? is_fp8(t->dtype()) : t->dtype() == DType::f8e4m3;
    CPF_CHECK(type_ok && t->dim() == 4 && t->is_contiguous() && t->device().is_cuda(), kOp,
              ": q, k, v and out must be contiguous (B, S, H, D) f8e4m3 CUDA tensors and d_out f8e5m2 or f8e4m3, got ",
              t->shape(), " ", dtype_name(t->dtype()), " on ", t->device());
    CPF_CHECK(t->device() == q.device(), kOp, ": q is on ", q.device(), " but another input on ", t->device());
  }
  CPF_CHECK(k.shape() == Shape({q.size(0), q.size(1), k.size(2), q.size(3)}) && v.shape() == k.shape() &&
                q.size(2) % k.size(2) == 0,
            kOp, ": k ", k.shape(), " and v ", v.shape(), " must be (B, S, H_kv, D) beside q ", q.shape(),
            " with H a multiple of H_kv");
  CPF_CHECK(out.shape() == q.shape() && d_out.shape() == q.shape(), kOp, ": out ", out.shape(), " and d_out ",
            d_out.shape(), " must have q's shape ", q.shape());
  check_defined(stats, kOp, "stats");
  CPF_CHECK(stats.dtype() == DType::f32 && stats.shape() == Shape({q.size(0), q.size(2), q.size(1), 1}) &&
                stats.is_contiguous() && stats.device() == q.device(),
            kOp, ": stats must be the forward's contiguous (B, H, S, 1) f32 on ", q.device(), ", got ", stats.shape(),
            " ", dtype_name(stats.dtype()));
  for (const Tensor* t : {&s.descale_q, &s.descale_k, &s.descale_v, &s.descale_o, &s.descale_do, &s.scale_s,
                          &s.descale_s, &s.scale_dp, &s.descale_dp, &s.scale_dq, &s.scale_dk, &s.scale_dv}) {
    CPF_CHECK(t->defined() && t->dtype() == DType::f32 && t->numel() == 1 && t->device() == q.device(), kOp,
              ": every scale and descale must be a () f32 tensor on ", q.device());
  }
}

}  // namespace

Fp8AttentionBackward cudnn_fp8_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                                  const Tensor& d_out, const Tensor& stats,
                                                  const Fp8AttentionBackwardScales& scales, double softmax_scale,
                                                  bool causal) {
  check_inputs(q, k, v, out, d_out, stats, scales);
#if CPF_HAVE_CUDNN
  using namespace cudnn;
  const int64_t b = q.size(0), s = q.size(1), h = q.size(2), hk = k.size(2), d = q.size(3);
  const auto bshd = [&](int64_t heads) { return Strides4{s * heads * d, d, heads * d, 1}; };
  const DType grad = d_out.dtype();
  SdpaGraphKey key;
  key.device = q.device().index;
  key.backward = true;
  key.io_type = CUDNN_DATA_FP8_E4M3;
  key.fp8 = true;
  key.fp8_grad_type = grad == DType::f8e5m2 ? CUDNN_DATA_FP8_E5M2 : CUDNN_DATA_FP8_E4M3;
  key.b = b;
  key.h_q = h;
  key.h_kv = hk;
  key.s_q = key.s_kv = s;
  key.d_qk = key.d_v = d;
  key.q = key.o = bshd(h);
  key.k = key.v = bshd(hk);
  key.right_bound = causal;
  const CachedPlan& cached = cached_plan(key);
  CPF_CHECK(cached.plan != nullptr, kOp, ": cuDNN has no FP8 attention backward engine for ", key.str(), ": ",
            cached.failure);
  const Device device = q.device();
  Fp8AttentionBackward r;
  r.dq = empty(q.shape(), {.dtype = grad, .device = device});
  r.dk = empty(k.shape(), {.dtype = grad, .device = device});
  r.dv = empty(v.shape(), {.dtype = grad, .device = device});
  for (Tensor* amax : {&r.amax_dp, &r.amax_dq, &r.amax_dk, &r.amax_dv}) {
    *amax = zeros({}, {.dtype = DType::f32, .device = device});
  }
  float scale = static_cast<float>(softmax_scale), neg_inf = std::numeric_limits<float>::lowest();
  VariantPack pack;
  const std::pair<int64_t, const Tensor*> tensors[] = {{kUidQ, &q},
                                                       {kUidK, &k},
                                                       {kUidV, &v},
                                                       {kUidO, &out},
                                                       {kUidDout, &d_out},
                                                       {kUidStats, &stats},
                                                       {kUidDq, &r.dq},
                                                       {kUidDk, &r.dk},
                                                       {kUidDv, &r.dv},
                                                       {kUidDescaleQ, &scales.descale_q},
                                                       {kUidDescaleK, &scales.descale_k},
                                                       {kUidDescaleV, &scales.descale_v},
                                                       {kUidDescaleO, &scales.descale_o},
                                                       {kUidDescaleDout, &scales.descale_do},
                                                       {kUidScaleS, &scales.scale_s},
                                                       {kUidDescaleS, &scales.descale_s},
                                                       {kUidScaleDp, &scales.scale_dp},
                                                       {kUidDescaleDp, &scales.descale_dp},
                                                       {kUidScaleDq, &scales.scale_dq},
                                                       {kUidScaleDk, &scales.scale_dk},
                                                       {kUidScaleDv, &scales.scale_dv},
                                                       {kUidAmaxDp, &r.amax_dp},
                                                       {kUidAmaxDq, &r.amax_dq},
                                                       {kUidAmaxDk, &r.amax_dk},
                                                       {kUidAmaxDv, &r.amax_dv}};
  for (const auto& [uid, tensor] : tensors) pack.add(uid, *tensor);
  pack.add_host(kUidScale, &scale);
  if (causal) pack.add_host(kUidNegInf, &neg_inf);
  pack.run(*cached.plan, device);
  return r;
#else
  (void)softmax_scale;
  (void)causal;
  CPF_FAIL(kOp, ": this build has no cuDNN (CPF_WITH_CUDNN=OFF)");
#endif
}

}  // namespace cpf::attention_cuda
