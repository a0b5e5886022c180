#include "attention/cuda/cudnn_fp8_forward.h"

#include <limits>

#include "framework/tensor/shape_utils.h"
#if CPF_HAVE_CUDNN
#include "attention/cuda/cudnn/graph_building.h"
#include "attention/cuda/cudnn/plan_cache.h"
#include "attention/cuda/cudnn/variant_pack.h"
#endif

namespace cpf::attention_cuda {
namespace {

constexpr const char* kOp = "cudnn_fp8_attention_forward";

void check_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const Fp8AttentionScales& s) {
  for (const Tensor* t : {&q, &k, &v}) {
    check_defined(*t, kOp, "q, k and v");
    CPF_CHECK(t->dtype() == DType::f8e4m3 && t->dim() == 4 && t->is_contiguous() && t->device().is_cuda(), kOp,
              ": q, k and v must be contiguous (B, S, H, D) f8e4m3 CUDA tensors, got ", t->shape(), " ",
              dtype_name(t->dtype()), " on ", t->device());
    CPF_CHECK(t->device() == q.device(), kOp, ": q is on ", q.device(), " but another input on ", t->device());
  }
  CPF_CHECK(k.shape() == Shape({q.size(0), q.size(1), k.size(2), q.size(3)}) && v.size(0) == q.size(0) &&
                v.size(1) == q.size(1) && v.size(2) == k.size(2) && q.size(2) % k.size(2) == 0,
            kOp, ": k ", k.shape(), " and v ", v.shape(), " must be (B, S, H_kv, D) beside q ", q.shape(),
            " with H a multiple of H_kv");
  for (const Tensor* t : {&s.descale_q, &s.descale_k, &s.descale_v, &s.scale_s, &s.descale_s, &s.scale_o}) {
    CPF_CHECK(t->defined() && t->dtype() == DType::f32 && t->numel() == 1 && t->device() == q.device(), kOp,
              ": every scale and descale must be a () f32 tensor on ", q.device());
  }
}

}  // namespace

Fp8AttentionForward cudnn_fp8_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                                const Fp8AttentionScales& scales, double softmax_scale, bool causal) {
  check_inputs(q, k, v, scales);
#if CPF_HAVE_CUDNN
  using namespace cudnn;
  const int64_t b = q.size(0), s = q.size(1), h = q.size(2), hk = k.size(2), d = q.size(3), dv = v.size(3);
  const auto bshd = [&](int64_t heads, int64_t dim) { return Strides4{s * heads * dim, dim, heads * dim, 1}; };
  SdpaGraphKey key;
  key.device = q.device().index;
  key.io_type = CUDNN_DATA_FP8_E4M3;
  key.fp8 = true;
  key.b = b;
  key.h_q = h;
  key.h_kv = hk;
  key.s_q = key.s_kv = s;
  key.d_qk = d;
  key.d_v = dv;
  key.q = bshd(h, d);
  key.k = bshd(hk, d);
  key.v = bshd(hk, dv);
  key.o = bshd(h, dv);
  key.right_bound = causal;
  const CachedPlan& cached = cached_plan(key);
  CPF_CHECK(cached.plan != nullptr, kOp, ": cuDNN has no FP8 attention engine for ", key.str(), ": ", cached.failure);
  Fp8AttentionForward r;
  const Device device = q.device();
  r.out = empty({b, s, h, dv}, {.dtype = DType::f8e4m3, .device = device});
  r.stats = empty({b, h, s, 1}, {.dtype = DType::f32, .device = device});
  r.amax_s = zeros({}, {.dtype = DType::f32, .device = device});
  r.amax_o = zeros({}, {.dtype = DType::f32, .device = device});
  float scale = static_cast<float>(softmax_scale), neg_inf = std::numeric_limits<float>::lowest();
  VariantPack pack;
  pack.add(kUidQ, q);
  pack.add(kUidK, k);
  pack.add(kUidV, v);
  pack.add(kUidO, r.out);
  pack.add(kUidStats, r.stats);
  pack.add_host(kUidScale, &scale);
  if (causal) pack.add_host(kUidNegInf, &neg_inf);
  pack.add(kUidDescaleQ, scales.descale_q);
  pack.add(kUidDescaleK, scales.descale_k);
  pack.add(kUidDescaleV, scales.descale_v);
  pack.add(kUidDescaleS, scales.descale_s);
  pack.add(kUidScaleS, scales.scale_s);
  pack.add(kUidScaleO, scales.scale_o);
  pack.add(kUidAmaxS, r.amax_s);
  pack.add(kUidAmaxO, r.amax_o);
  pack.run(*cached.plan, device);
  return r;
#else
  (void)softmax_scale;
  (void)causal;
  CPF_FAIL(kOp, ": this build has no cuDNN (CPF_WITH_CUDNN=OFF)");
#endif
}

}  // namespace cpf::attention_cuda
