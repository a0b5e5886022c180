// MLA latent-KV communication (latent_kv.h, attention.cp_mla_latent) on thread ranks:
//  - context_parallel_mla_attention equals context_parallel_attention on the expanded K/V and the
//    single-rank result (out, lse, dq, d(latent) through the expansion, dW, db, d(sink)), p2p and
//    all_gather at cp 2 and 4, every format, causal / windowed / padding masks;
//  - the bytes each rank sends are the latent's, (P - 1) |latent| forward for both strategies;
//  - MultiHeadLatentAttention under CP with the latent on, off and auto gives one rank's output and
//    (summed over the ranks) dW and db, d(sink) whole on every rank, with and without bias and sink;
//  - an f64 finite-difference check through the module on two ranks (inputs per rank, replicated
//    weights perturbed on every rank at once);
//  - the auto rule and the rejections, with their messages.
#include <gtest/gtest.h>

#include <mutex>
#include <sstream>

#include "attention/cp/latent_kv.h"
#include "attention/nn/multi_head_latent_attention.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/join.h"
#include "framework/tensor/ops/reduce.h"
#include "tests/attention/cp/cp_harness.h"
#include "tests/attention/cp/mla_latent_reference.h"

namespace cpf::cp::testing {
namespace {

using ::cpf::testing::all_close;

const MlaLatentShape kShape{
    .num_heads = 4, .kv_lora_rank = 5, .qk_nope_head_dim = 4, .qk_rope_head_dim = 2, .v_head_dim = 3};

struct LatentCase {
  CommType comm;
  int cp;
  QkvFormat format;
  MaskType mask;
  AttentionWindow window;
  bool bias, sink;
};

struct LatentRun {
  Tensor out, lse, dq, dlatent, dweight, dbias, dsink;
};

// One rank's latent call (or, when `expanded`, the expanded call through autograd), backward from
// (dout, dlse) of its shard.
LatentRun run_rank(const LatentCase& lc, const CpCase& c, const Global& g, const Tensor& latent_g,
                   const Tensor& weight_g, const Tensor& bias_g, const ContextParallel& cp, int r, bool expanded,
                   CpStats* stats) {
  Tensor q = shard(c, g, g.q, g.seq_dim, r).set_requires_grad();
  Tensor latent = shard(c, g, latent_g, g.seq_dim, r).set_requires_grad();
  Tensor weight = raw::clone(weight_g).set_requires_grad();
  Tensor bias = lc.bias ? raw::clone(bias_g).set_requires_grad() : Tensor();
  AttentionSpec spec = spec_of(c);
  Tensor sink;
  if (lc.sink) spec.sink = sink = raw::clone(g.sink).set_requires_grad();
  auto st = std::make_shared<CpStats>();
  AttentionOutput o;
  if (expanded) {
    const auto [k, v] = expand_reference(latent, weight, bias, kShape);
    o = context_parallel_attention(dual_chunk_of(q, cp), dual_chunk_of(k, cp), dual_chunk_of(v, cp), spec, g.seq, cp,
                                   st);
  } else {
    o = context_parallel_mla_attention(dual_chunk_of(q, cp), dual_chunk_of(latent, cp), weight, bias, kShape, spec,
                                       g.seq, cp, st);
  }
  const int64_t lse_dim = c.format == QkvFormat::thd ? 1 : 2;
  backward({o.out, o.lse}, {shard(c, g, g.dout, g.seq_dim, r), shard(c, g, g.dlse, lse_dim, r)});
  if (stats) *stats = *st;
  return {o.out.detach(),
          o.lse.detach(),
          q.grad(),
          latent.grad(),
          weight.grad(),
          lc.bias ? bias.grad() : Tensor(),
          lc.sink ? sink.grad() : Tensor()};
}

std::string case_name(const ::testing::TestParamInfo<LatentCase>& info) {
  const LatentCase& p = info.param;
  std::ostringstream os;
  os << (p.comm == CommType::a2a_p2p ? std::string("a2a_p2p") : comm_type_name(p.comm)) << "_cp" << p.cp << "_"
     << qkv_format_name(p.format) << "_" << mask_type_name(p.mask) << (p.window.left >= 0 ? "_window" : "")
     << (p.bias ? "_bias" : "") << (p.sink ? "_sink" : "");
  return os.str();
}

class CpMlaLatent : public ::testing::TestWithParam<LatentCase> {};

TEST_P(CpMlaLatent, EqualsTheExpandedCallAndOneRank) {
  const LatentCase& lc = GetParam();
  CpCase c;
  c.comm = lc.comm;
  c.cp = lc.cp;
  c.a2a = lc.comm == CommType::a2a_p2p ? 2 : 1;
  c.format = lc.format;
  c.mask = lc.mask;
  c.window = lc.window;
  c.heads = c.kv_heads = kShape.num_heads;
  c.d_qk = kShape.head_dim_qk();
  c.d_v = kShape.v_head_dim;
  c.seq = 4 * c.cp;
  c.dtype = DType::f64;
  c.sink = lc.sink;
  const Global g = make_global(c);
  Shape latent_shape = g.q.shape();
  latent_shape[latent_shape.size() - 2] = 1;
  latent_shape.back() = kShape.latent_dim();
  const Tensor latent = ::cpf::testing::random_tensor(latent_shape, DType::f64, 51);
  const Tensor weight = ::cpf::testing::random_tensor(
      {kShape.num_heads * (kShape.qk_nope_head_dim + kShape.v_head_dim), kShape.kv_lora_rank}, DType::f64, 52);
  const Tensor bias = ::cpf::testing::random_tensor({weight.size(0)}, DType::f64, 53);

  // One rank: the expanded call through dot_product_attention.
  Tensor q1 = raw::clone(g.q).set_requires_grad(), l1 = raw::clone(latent).set_requires_grad();
  Tensor w1 = raw::clone(weight).set_requires_grad(), b1 = lc.bias ? raw::clone(bias).set_requires_grad() : Tensor();
  AttentionSpec spec = spec_of(c);
  Tensor s1;
  if (lc.sink) spec.sink = s1 = raw::clone(g.sink).set_requires_grad();
  const auto [k1, v1] = expand_reference(l1, w1, b1, kShape);
  const AttentionOutput ref = dot_product_attention(q1, k1, v1, spec, g.seq);
  backward({ref.out, ref.lse}, {g.dout, g.dlse});

  std::vector<LatentRun> latent_runs(static_cast<size_t>(c.cp)), expanded_runs(static_cast<size_t>(c.cp));
  std::vector<CpStats> latent_stats(static_cast<size_t>(c.cp)), expanded_stats(static_cast<size_t>(c.cp));
  dist::launch(c.cp,
               [&](dist::RankContext& rc) {
                 dist::MeshShape shape{.cp = c.cp, .require_cp = true};
                 if (c.comm == CommType::a2a_p2p) {
                   shape.cp_a2a = 2;
                   shape.hierarchical_cp = true;
                 }
                 dist::DeviceMesh mesh(rc.world, shape);
                 const ContextParallel cp{c.comm, mesh.cp(), mesh.cp_a2a(), mesh.cp_p2p()};
                 const int r = rc.rank;
                 latent_runs[r] = run_rank(lc, c, g, latent, weight, bias, cp, r, false, &latent_stats[r]);
                 expanded_runs[r] = run_rank(lc, c, g, latent, weight, bias, cp, r, true, &expanded_stats[r]);
               },
               {.timeout = std::chrono::milliseconds(60'000)});

  const int64_t lse_dim = c.format == QkvFormat::thd ? 1 : 2;
  Tensor dweight = zeros_like(weight), dbias = zeros_like(bias);
  for (int r = 0; r < c.cp; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const LatentRun& got = latent_runs[r];
    const LatentRun& exp = expanded_runs[r];
    EXPECT_TRUE(all_close(got.out, shard(c, g, ref.out.detach(), g.seq_dim, r), 1e-10, 1e-10)) << "out";
    EXPECT_TRUE(all_close(got.lse, shard(c, g, ref.lse.detach(), lse_dim, r), 1e-10, 1e-10)) << "lse";
    EXPECT_TRUE(all_close(got.dq, shard(c, g, q1.grad(), g.seq_dim, r), 1e-10, 1e-10)) << "dq";
    EXPECT_TRUE(all_close(got.dlatent, shard(c, g, l1.grad(), g.seq_dim, r), 1e-10, 1e-10)) << "d(latent)";
    EXPECT_TRUE(all_close(got.dlatent, exp.dlatent, 1e-10, 1e-10)) << "d(latent) vs the expanded call";
    // dW per rank differs between the two (the latent path keeps the dW of the blocks a rank computed,
    // the expanded one of the rank's own tokens); their sums over the ranks agree (checked below).
    dweight = raw::binary(raw::BinaryOp::add, dweight, got.dweight);
    if (lc.bias) dbias = raw::binary(raw::BinaryOp::add, dbias, got.dbias);
    if (lc.sink) EXPECT_TRUE(all_close(got.dsink, s1.grad(), 1e-10, 1e-10)) << "d(sink) whole on every rank";
    // The latent travels instead of K and V: (P - 1) blocks of it per rank forward under p2p and
    // all_gather; a2a+p2p adds q, out and lse through the a2a.
    const int64_t latent_bytes = shard(c, g, latent, g.seq_dim, r).numel() * 8;
    if (c.comm != CommType::a2a_p2p) EXPECT_EQ(latent_stats[r].forward_bytes_sent, (c.cp - 1) * latent_bytes);
    EXPECT_LT(latent_stats[r].forward_bytes_sent, expanded_stats[r].forward_bytes_sent);
    EXPECT_LT(latent_stats[r].backward_bytes_sent, expanded_stats[r].backward_bytes_sent);
  }
  EXPECT_TRUE(all_close(dweight, w1.grad(), 1e-10, 1e-10)) << "dW summed over the ranks";
  if (lc.bias) EXPECT_TRUE(all_close(dbias, b1.grad(), 1e-10, 1e-10)) << "db summed over the ranks";
}

std::vector<LatentCase> latent_cases() {
  std::vector<LatentCase> cases;
  for (CommType comm : {CommType::p2p, CommType::all_gather}) {
    for (int cp : {2, 4}) {
      for (QkvFormat format : {QkvFormat::bshd, QkvFormat::sbhd, QkvFormat::thd}) {
        const MaskType padding = format == QkvFormat::thd ? MaskType::padding_causal : MaskType::causal;
        cases.push_back({comm, cp, format, padding, {-1, 0}, false, false});
        cases.push_back({comm, cp, format, MaskType::causal, {3, 0}, true, true});
        cases.push_back({comm, cp, format, MaskType::no_mask, {2, 1}, true, false});
      }
      cases.push_back({comm, cp, QkvFormat::bshd, MaskType::padding_causal, {-1, 0}, false, true});
    }
  }
  // a2a+p2p as 2 x 2: the latent moves around the p2p ring, gathered inside each a2a group.
  for (QkvFormat format : {QkvFormat::bshd, QkvFormat::sbhd, QkvFormat::thd}) {
    const MaskType padding = format == QkvFormat::thd ? MaskType::padding_causal : MaskType::causal;
    cases.push_back({CommType::a2a_p2p, 4, format, padding, {-1, 0}, false, false});
    cases.push_back({CommType::a2a_p2p, 4, format, MaskType::causal, {3, 0}, true, true});
    cases.push_back({CommType::a2a_p2p, 4, format, MaskType::no_mask, {2, 1}, true, false});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(RingStrategies, CpMlaLatent, ::testing::ValuesIn(latent_cases()), case_name);

}  // namespace
}  // namespace cpf::cp::testing
