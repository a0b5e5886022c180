// MLA latent-KV communication on one GPU: p2p and all_gather at cp = 2, and a2a+p2p at cp = 4 (a2a 2 x
// p2p 2), with thread ranks that all hold cuda:0 (dist::launch with DevicePolicy::cuda), bshd and thd,
// causal, with an attention sink, f32 on the unfused path and bf16 on auto (cuDNN where it runs). Each
// rank's out, lse, dq and the latent's gradient must match its shard of the single-rank CPU result with
// the expansion done by autograd ops, dW summed over the ranks and every rank's d(sink) must match the
// CPU's (norm-wise relative error: 1e-5 for
// f32, 3.5e-2 for bf16 against the f32 reference on the same bf16-rounded inputs). Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>

#include "attention/cp/latent_kv.h"
#include "framework/tensor/ops/elementwise.h"
#include "tests/attention/cp/cp_harness.h"
#include "tests/attention/cp/mla_latent_reference.h"
#include "tests/attention/cuda/attention_gpu_support.h"
#include "tests/tensor/cuda/cuda_test_utils.h"

namespace cpf::cp::testing {
namespace {

using ::cpf::testing::close_to_reference;

// Head dims that are multiples of 8, so cuDNN can take the bf16 tiles.
const MlaLatentShape kShape{
    .num_heads = 4, .kv_lora_rank = 32, .qk_nope_head_dim = 48, .qk_rope_head_dim = 16, .v_head_dim = 64};

struct Result {
  Tensor out, lse, dq, dlatent, dweight, dsink;
};

struct Param {
  CommType comm;
  QkvFormat format;
  DType dtype;
};

class CpMlaLatentGpu : public ::testing::WithParamInterface<Param>, public ::cpf::testing::CudaTest {};

TEST_P(CpMlaLatentGpu, ShardsMatchTheCpuReference) {
  const Param& p = GetParam();
  CpCase c;
  c.comm = p.comm;
  c.cp = p.comm == CommType::a2a_p2p ? 4 : 2;
  c.a2a = p.comm == CommType::a2a_p2p ? 2 : 1;
  c.format = p.format;
  c.mask = p.format == QkvFormat::thd ? MaskType::padding_causal : MaskType::causal;
  c.heads = c.kv_heads = kShape.num_heads;
  c.d_qk = kShape.head_dim_qk();
  c.d_v = kShape.v_head_dim;
  c.seq = 64;
  c.thd_lengths = {37, 60, 3};
  c.sink = true;
  Global g = make_global(c);  // f32
  Shape latent_shape = g.q.shape();
  latent_shape[latent_shape.size() - 2] = 1;
  latent_shape.back() = kShape.latent_dim();
  // Inputs rounded once to the run's dtype; the reference computes in f32 on the same values.
  auto rounded = [&](const Tensor& t) { return raw::to(raw::to(t, p.dtype), DType::f32); };
  g.q = rounded(g.q);
  g.dout = rounded(g.dout);
  const Tensor latent = rounded(::cpf::testing::random_tensor(latent_shape, DType::f32, 61));
  const Tensor weight = rounded(::cpf::testing::random_tensor(
      {kShape.num_heads * (kShape.qk_nope_head_dim + kShape.v_head_dim), kShape.kv_lora_rank}, DType::f32, 62, -0.2,
      0.2));

  Tensor q1 = raw::clone(g.q).set_requires_grad(), l1 = raw::clone(latent).set_requires_grad();
  Tensor w1 = raw::clone(weight).set_requires_grad(), s1 = raw::clone(g.sink).set_requires_grad();
  AttentionSpec spec = spec_of(c);
  spec.sink = s1;
  const auto [k1, v1] = expand_reference(l1, w1, Tensor(), kShape);
  const AttentionOutput ref = dot_product_attention(q1, k1, v1, spec, g.seq);
  backward({ref.out}, {g.dout});

  std::vector<Result> results(static_cast<size_t>(c.cp));
  const AttentionKernelConfig kernel_config{.backend = p.dtype == DType::f32 ? AttentionBackend::unfused
                                                                             : AttentionBackend::automatic};
  dist::launch(
      static_cast<int>(c.cp),
      [&](dist::RankContext& rc) {
        const bool hierarchical = c.comm == CommType::a2a_p2p;
        dist::DeviceMesh mesh(
            rc.world,
            {.cp = c.cp, .cp_a2a = hierarchical ? c.a2a : 0, .require_cp = true, .hierarchical_cp = hierarchical});
        const ContextParallel cp{c.comm, mesh.cp(), mesh.cp_a2a(), mesh.cp_p2p(), kernel_config};
        const int r = rc.rank;
        auto put = [&](const Tensor& t) { return raw::to(raw::to(t, p.dtype), rc.device); };
        Tensor q = put(shard(c, g, g.q, g.seq_dim, r)).set_requires_grad();
        Tensor l = put(shard(c, g, latent, g.seq_dim, r)).set_requires_grad();
        Tensor w = put(weight).set_requires_grad();
        AttentionSpec s = spec_of(c);
        s.sink = raw::to(g.sink, rc.device).set_requires_grad();
        const AttentionOutput o = context_parallel_mla_attention(dual_chunk_of(q, cp), dual_chunk_of(l, cp), w,
                                                                 Tensor(), kShape, s, g.seq, cp);
        backward({o.out}, {put(shard(c, g, g.dout, g.seq_dim, r))});
        auto host = [](const Tensor& t) { return raw::to(raw::to(t.detach(), Device::cpu()), DType::f32); };
        results[static_cast<size_t>(r)] = {host(o.out),    host(o.lse),    host(q.grad()),
                                           host(l.grad()), host(w.grad()), host(s.sink.grad())};
      },
      {.timeout = std::chrono::milliseconds(120'000), .devices = dist::DevicePolicy::cuda});

  const double tol = p.dtype == DType::f32 ? 1e-5 : 3.5e-2;
  const int64_t lse_dim = c.format == QkvFormat::thd ? 1 : 2;
  Tensor dweight = zeros_like(weight);
  for (int r = 0; r < c.cp; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const Result& got = results[static_cast<size_t>(r)];
    EXPECT_TRUE(close_to_reference(got.out, shard(c, g, ref.out.detach(), g.seq_dim, r), tol)) << "out";
    EXPECT_TRUE(
        close_to_reference(got.lse, shard(c, g, ref.lse.detach(), lse_dim, r), p.dtype == DType::f32 ? 1e-5 : 1e-3))
        << "lse";
    EXPECT_TRUE(close_to_reference(got.dq, shard(c, g, q1.grad(), g.seq_dim, r), tol)) << "dq";
    EXPECT_TRUE(close_to_reference(got.dlatent, shard(c, g, l1.grad(), g.seq_dim, r), tol)) << "d(latent)";
    dweight = raw::binary(raw::BinaryOp::add, dweight, got.dweight);
    EXPECT_TRUE(close_to_reference(got.dsink, s1.grad(), tol)) << "d(sink) whole on every rank";
  }
  EXPECT_TRUE(close_to_reference(dweight, w1.grad(), tol)) << "dW summed over the ranks";
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  std::ostringstream os;
  os << comm_type_name(info.param.comm) << "_" << qkv_format_name(info.param.format) << "_"
     << dtype_name(info.param.dtype);
  std::string name = os.str();
  std::replace(name.begin(), name.end(), '+', '_');  // "a2a+p2p": test names take letters, digits and _
  return name;
}

std::vector<Param> params() {
  std::vector<Param> ps;
  for (CommType comm : {CommType::p2p, CommType::all_gather, CommType::a2a_p2p}) {
    for (QkvFormat format : {QkvFormat::bshd, QkvFormat::thd}) {
      for (DType dtype : {DType::f32, DType::bf16}) ps.push_back({comm, format, dtype});
    }
  }
  return ps;
}

INSTANTIATE_TEST_SUITE_P(LatentStrategies, CpMlaLatentGpu, ::testing::ValuesIn(params()), param_name);

}  // namespace
}  // namespace cpf::cp::testing
