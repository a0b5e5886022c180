// MultiHeadLatentAttention under context parallelism with attention.cp_mla_latent on, off and auto:
// each rank's output equals one rank's on its shard and every parameter gradient, summed over the
// ranks, equals one rank's (p2p and all_gather, cp 2 and 4, with and without bias and sinks); an f64
// finite-difference check through the module on two ranks with the latent on; the auto rule and the
// rejections, with their messages.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <mutex>

#include "attention/cp/latent_kv.h"
#include "attention/cp/sharding.h"
#include "attention/nn/multi_head_latent_attention.h"
#include "framework/autograd/ops.h"
#include "framework/distributed/device_mesh.h"
#include "framework/distributed/launcher.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/reduce.h"
#include "support/test_utils.h"

namespace cpf::cp {
namespace {

using ::cpf::testing::all_close;
using ::cpf::testing::random_tensor;
using nn::MultiHeadLatentAttention;

std::shared_ptr<MultiHeadLatentAttention> make_mla(bool bias, bool sink) {
  Generator gen(21);
  auto mla =
      std::make_shared<MultiHeadLatentAttention>(nn::MultiHeadLatentAttentionOptions{.hidden_size = 6,
                                                                                     .num_heads = 2,
                                                                                     .kv_lora_rank = 3,
                                                                                     .qk_nope_head_dim = 2,
                                                                                     .qk_rope_head_dim = 2,
                                                                                     .v_head_dim = 3,
                                                                                     .qkv_format = QkvFormat::thd,
                                                                                     .mask = MaskType::padding_causal,
                                                                                     .window = {6, 0},
                                                                                     .bias = bias,
                                                                                     .dtype = DType::f64,
                                                                                     .attention_sink = sink},
                                                 &gen);
  if (sink) {
    for (const auto& [name, p] : mla->named_parameters()) {
      if (name == "sinks") raw::copy_(p, random_tensor({2}, DType::f64, 22, -1, 1));
    }
  }
  return mla;
}

struct Problem {
  std::vector<int64_t> cu, cu_padded;
  SequenceInfo seq;
  Tensor x, dy;
};

Problem problem(int cp) {
  const std::vector<int64_t> cu{0, 9, 14}, cu_padded = pad_cu_seqlens(cu, cp);
  return {cu, cu_padded, SequenceInfo::from_cu_seqlens(cu, cu_padded),
          random_tensor({cu_padded.back(), 6}, DType::f64, 23), random_tensor({cu_padded.back(), 6}, DType::f64, 24)};
}

std::map<std::string, Tensor> grads_of(const nn::Module& m) {
  std::map<std::string, Tensor> grads;
  for (const auto& [n, t] : m.named_parameters()) grads[n] = t.grad().defined() ? t.grad() : zeros_like(t);
  return grads;
}

void expect_module_matches_one_rank(CommType comm, int cp_size, MlaLatentMode mode, bool bias, bool sink) {
  const Problem pr = problem(cp_size);
  const auto single = make_mla(bias, sink);
  const Tensor y = single->forward(raw::clone(pr.x), pr.seq);
  backward({y}, {pr.dy});
  const std::map<std::string, Tensor> want = grads_of(*single);
  std::vector<std::map<std::string, Tensor>> rank_grads(static_cast<size_t>(cp_size));
  std::mutex mu;
  dist::launch(cp_size,
               [&](dist::RankContext& rc) {
                 dist::MeshShape shape{.cp = cp_size, .require_cp = true};
                 if (comm == CommType::a2a_p2p) {
                   shape.cp_a2a = 2;
                   shape.hierarchical_cp = true;
                 }
                 dist::DeviceMesh mesh(rc.world, shape);
                 ContextParallel cp{comm, mesh.cp(), mesh.cp_a2a(), mesh.cp_p2p()};
                 cp.mla_latent = mode;
                 const ThdShard shard = thd_shard(pr.cu, pr.cu_padded, cp_size, rc.rank);
                 const auto mla = make_mla(bias, sink);
                 const Tensor local = mla->forward(shard_tokens(pr.x, shard), pr.seq, &cp);
                 backward({local}, {shard_tokens(pr.dy, shard)});
                 std::lock_guard<std::mutex> lock(mu);
                 EXPECT_TRUE(all_close(local, shard_tokens(y.detach(), shard), 1e-10, 1e-10))
                     << "output of rank " << rc.rank;
                 rank_grads[static_cast<size_t>(rc.rank)] = grads_of(*mla);
               },
               {.timeout = std::chrono::milliseconds(60'000)});
  for (const auto& [name, g] : want) {
    Tensor sum = zeros_like(g);
    for (const auto& rank : rank_grads) sum = raw::binary(raw::BinaryOp::add, sum, rank.at(name));
    EXPECT_TRUE(all_close(sum, g, 1e-10, 1e-10)) << name << " summed over the ranks";
  }
}

TEST(CpMlaLatentModule, OnOffAndAutoEqualOneRank) {
  for (CommType comm : {CommType::p2p, CommType::all_gather, CommType::a2a_p2p}) {
    for (int cp : {2, 4}) {
      if (comm == CommType::a2a_p2p && cp != 4) continue;  // 2 (a2a) x 2 (p2p)
      for (MlaLatentMode mode : {MlaLatentMode::on, MlaLatentMode::off, MlaLatentMode::automatic}) {
        SCOPED_TRACE(comm_type_name(comm) + " cp " + std::to_string(cp) + " " + mla_latent_mode_name(mode));
        expect_module_matches_one_rank(comm, cp, mode, false, false);
      }
      SCOPED_TRACE(comm_type_name(comm) + " cp " + std::to_string(cp) + " bias + sinks");
      expect_module_matches_one_rank(comm, cp, MlaLatentMode::on, true, true);
    }
  }
}

// Finite differences of L = sum over ranks <dy_r, y_r> with the latent on: each rank's x shard is
// perturbed alone; a (replicated) parameter is perturbed on every rank at once and its analytic
// gradient is the sum of the ranks' gradients.
TEST(CpMlaLatentModule, GradcheckF64ThroughTheModule) {
  const int cp_size = 2;
  const Problem pr = problem(cp_size);
  std::mutex mu;
  std::vector<std::string> failures;
  int checked = 0;
  dist::launch(cp_size,
               [&](dist::RankContext& rc) {
                 dist::DeviceMesh mesh(rc.world, {.cp = cp_size, .require_cp = true});
                 ContextParallel cp{CommType::p2p, mesh.cp()};
                 cp.mla_latent = MlaLatentMode::on;
                 const ThdShard shard = thd_shard(pr.cu, pr.cu_padded, cp_size, rc.rank);
                 const auto mla = make_mla(true, true);
                 Tensor x = raw::clone(shard_tokens(pr.x, shard)).set_requires_grad();
                 const Tensor dy = shard_tokens(pr.dy, shard);
                 backward({mla->forward(x, pr.seq, &cp)}, {dy});
                 auto total = [&] {
                   NoGradGuard no_grad;
                   const double local = raw::sum(raw::mul(mla->forward(x, pr.seq, &cp), dy)).item<double>();
                   return rc.world->all_reduce(full({}, local, {.dtype = DType::f64})).item<double>();
                 };
                 auto check = [&](const Tensor& t, const Tensor& analytic, const std::string& what, bool every_rank,
                                  int owner) {
                   for (int64_t e = 0; e < t.numel(); ++e) {
                     double* v = t.data<double>() + e;
                     const double original = *v, eps = 1e-6;
                     const bool mine = every_rank || rc.rank == owner;
                     if (mine) *v = original + eps;
                     const double plus = total();
                     if (mine) *v = original - eps;
                     const double minus = total();
                     if (mine) *v = original;
                     const double numeric = (plus - minus) / (2 * eps), a = analytic.data<double>()[e];
                     if (rc.rank == owner && std::abs(numeric - a) > 1e-6 + 1e-5 * std::abs(numeric)) {
                       std::lock_guard<std::mutex> lock(mu);
                       failures.push_back(what + "[" + std::to_string(e) + "]: analytic " + std::to_string(a) +
                                          ", numeric " + std::to_string(numeric));
                     }
                     if (rc.rank == owner) {
                       std::lock_guard<std::mutex> lock(mu);
                       ++checked;
                     }
                   }
                 };
                 for (int owner = 0; owner < cp_size; ++owner)
                   check(x, x.grad(), "x of rank " + std::to_string(owner), false, owner);
                 for (const auto& [name, p] : mla->named_parameters()) {
                   const Tensor summed = rc.world->all_reduce(p.grad());
                   check(p, summed, name, true, 0);
                 }
               },
               {.timeout = std::chrono::milliseconds(120'000)});
  EXPECT_GT(checked, 100);
  EXPECT_TRUE(failures.empty()) << failures.size() << " mismatches, first: " << failures.front();
}

// DeepSeek-V2-Lite's layer (h 16, d_qk 192 = 128 + 64 RoPE, d_v 128, kv_lora_rank 512), causal bf16.
const MlaLatentShape kV2Lite{
    .num_heads = 16, .kv_lora_rank = 512, .qk_nope_head_dim = 128, .qk_rope_head_dim = 64, .v_head_dim = 128};

MlaLatentCall v2_lite_call(bool ring, int64_t ranks, int64_t tokens) {
  return {.ring = ring,
          .ranks = ranks,
          .tokens_per_rank = tokens,
          .tile_pairs = static_cast<double>(tokens) * static_cast<double>(tokens),
          .element_bytes = 2};
}

MlaLatentRates cuda_rates(double link_gbps) {
  return {.link_bytes_per_s = link_gbps * 1e9, .flops_per_s = 400e12, .accumulate_flops_per_s = 50e12};
}

// The measurement of docs/cp.md (2 x H200 over NVLink): expanded K/V were faster under p2p and
// all_gather at 16384 and 65536 tokens per GPU; the rule at the NVLink default agrees.
TEST(CpMlaLatentAuto, ExpandedOnNvlinkAsMeasured) {
  for (bool ring : {true, false}) {
    for (int64_t tokens : {16384, 65536}) {
      const MlaLatentChoice c = choose_mla_latent(kV2Lite, v2_lite_call(ring, 2, tokens), cuda_rates(150));
      EXPECT_FALSE(c.latent) << (ring ? "p2p " : "all_gather ") << tokens << ": " << c.why;
      EXPECT_NE(c.why.find("latent 576 vs expanded K/V 5120 values per token"), std::string::npos) << c.why;
    }
  }
  // p2p at 16384: the forward and backward windows hide everything; only the last gradient hop shows.
  const MlaLatentChoice p2p = choose_mla_latent(kV2Lite, v2_lite_call(true, 2, 16384), cuda_rates(150));
  EXPECT_NE(p2p.why.find("16384 tokens per rank over 2 ranks: exposed communication 1.11848 ms expanded vs "
                         "0.125829 ms latent at 150 GB/s"),
            std::string::npos)
      << p2p.why;
  EXPECT_EQ(mla_latent_rates(Device::cuda(0), DType::bf16).flops_per_s, 400e12);
  EXPECT_EQ(mla_latent_rates(Device::cuda(0), DType::f32).flops_per_s, 50e12);
}

// Where communication dominates, the latent travels: a slow link, or few tokens per rank on an
// InfiniBand-class link with many ranks.
TEST(CpMlaLatentAuto, LatentWhereCommunicationDominates) {
  for (bool ring : {true, false}) {
    const MlaLatentChoice slow = choose_mla_latent(kV2Lite, v2_lite_call(ring, 2, 16384), cuda_rates(25));
    EXPECT_TRUE(slow.latent) << slow.why;
    const MlaLatentChoice few = choose_mla_latent(kV2Lite, v2_lite_call(ring, 8, 1024), cuda_rates(50));
    EXPECT_TRUE(few.latent) << few.why;
    // The same few tokens on NVLink: the fp32 projection of dK/dV costs about what the bytes take.
    EXPECT_FALSE(choose_mla_latent(kV2Lite, v2_lite_call(ring, 8, 1024), cuda_rates(150)).latent);
  }
  // A link far faster than the expansion: K/V travel.
  EXPECT_FALSE(choose_mla_latent(kV2Lite, v2_lite_call(true, 4, 128), {1e15, 1e9, 1e9}).latent);
}

// CPU thread ranks (10 GB/s, 100 GFLOP/s): the module tests' small MLA (2 heads over a 3-value latent)
// moves the latent, whose expansion costs almost nothing there; V2-Lite's expansion (4 GEMMs of 512 x
// 4096 per token) costs more than its bytes take, so K/V travel.
TEST(CpMlaLatentAuto, CpuRanksExerciseBothChoices) {
  const MlaLatentShape small{
      .num_heads = 2, .kv_lora_rank = 3, .qk_nope_head_dim = 2, .qk_rope_head_dim = 2, .v_head_dim = 3};
  const MlaLatentCall small_call{.ring = true, .ranks = 2, .tokens_per_rank = 8, .tile_pairs = 64, .element_bytes = 8};
  EXPECT_TRUE(resolve_mla_latent(MlaLatentMode::automatic, "p2p", true, small, small_call, DType::f64, Device::cpu()));
  EXPECT_FALSE(resolve_mla_latent(MlaLatentMode::automatic, "p2p", true, kV2Lite, v2_lite_call(true, 2, 16),
                                  DType::bf16, Device::cpu()));
  EXPECT_FALSE(resolve_mla_latent(MlaLatentMode::automatic, "all_gather", true, kV2Lite, v2_lite_call(false, 2, 16384),
                                  DType::bf16, Device::cpu()));
  EXPECT_FALSE(resolve_mla_latent(MlaLatentMode::automatic, "a2a", false, kV2Lite, v2_lite_call(true, 2, 16),
                                  DType::bf16, Device::cpu()));
  EXPECT_TRUE(resolve_mla_latent(MlaLatentMode::on, "p2p", true, kV2Lite, v2_lite_call(true, 2, 16384), DType::bf16,
                                 Device::cpu()));
  EXPECT_FALSE(resolve_mla_latent(MlaLatentMode::off, "p2p", true, kV2Lite, v2_lite_call(true, 2, 16), DType::bf16,
                                  Device::cpu()));
  EXPECT_EQ(parse_mla_latent_mode("auto"), MlaLatentMode::automatic);
  EXPECT_CPF_ERROR(parse_mla_latent_mode("always"), "unknown cp_mla_latent 'always' (valid: auto, on, off)");
}

// Tile pairs: per packed sequence (its padded length / ranks)^2, else batch x per-sequence length^2.
TEST(CpMlaLatentAuto, TilePairs) {
  const SequenceInfo seq = SequenceInfo::from_cu_seqlens({0, 5, 13}, {0, 8, 16});
  EXPECT_EQ(mla_tile_pairs(seq, 8, 1, 2), 4.0 * 4.0 + 4.0 * 4.0);
  EXPECT_EQ(mla_tile_pairs(std::nullopt, 12, 3, 2), 3 * 4.0 * 4.0);
}

TEST(CpMlaLatentAuto, RejectsBadRatesCallsAndLinkSetting) {
  EXPECT_CPF_ERROR(choose_mla_latent(kV2Lite, v2_lite_call(true, 2, 16), {0, 1, 1}),
                   "cp_mla_latent auto: link and compute rates must be positive: 0 B/s, 1 and 1 FLOP/s");
  EXPECT_CPF_ERROR(choose_mla_latent(kV2Lite, v2_lite_call(true, 1, 16), cuda_rates(150)),
                   "cp_mla_latent auto: the call needs ranks >= 2 and positive tokens per rank, tile pairs and "
                   "element bytes: ranks=1 tokens_per_rank=16");
  EXPECT_CPF_ERROR(mla_tile_pairs(std::nullopt, 7, 2, 2),
                   "cp_mla_latent auto: 7 tokens per rank do not split into 2 sequences over 2 ranks");
  ::setenv("CPF_CP_LINK_GBPS", "25", 1);
  EXPECT_EQ(cp_link_bytes_per_s(150e9), 25e9);
  EXPECT_EQ(mla_latent_rates(Device::cuda(0), DType::bf16).link_bytes_per_s, 25e9);
  ::setenv("CPF_CP_LINK_GBPS", "fast", 1);
  EXPECT_CPF_ERROR(cp_link_bytes_per_s(150e9), "CPF_CP_LINK_GBPS='fast' is not a positive number of GB/s");
  ::setenv("CPF_CP_LINK_GBPS", "-3", 1);
  EXPECT_CPF_ERROR(cp_link_bytes_per_s(150e9), "CPF_CP_LINK_GBPS='-3' is not a positive number of GB/s");
  ::unsetenv("CPF_CP_LINK_GBPS");
  EXPECT_EQ(cp_link_bytes_per_s(150e9), 150e9);
}

TEST(CpMlaLatentValidation, RejectsUlyssesAndMismatchedShapes) {
  dist::launch(2, [&](dist::RankContext& rc) {
    dist::DeviceMesh mesh(rc.world, {.cp = 2, .require_cp = true});
    const MlaLatentShape s{
        .num_heads = 2, .kv_lora_rank = 3, .qk_nope_head_dim = 2, .qk_rope_head_dim = 2, .v_head_dim = 3};
    const Tensor q = random_tensor({1, 4, 2, 4}, DType::f64, 1), latent = random_tensor({1, 4, 1, 5}, DType::f64, 2);
    const Tensor w = random_tensor({10, 3}, DType::f64, 3);
    const AttentionSpec spec{.mask = MaskType::causal};
    EXPECT_CPF_ERROR(
        context_parallel_mla_attention(dual_chunk_of(q, ContextParallel{CommType::a2a, mesh.cp()}),
                                       dual_chunk_of(latent, ContextParallel{CommType::a2a, mesh.cp()}), w, Tensor(), s,
                                       spec, std::nullopt, ContextParallel{CommType::a2a, mesh.cp()}),
        "context parallel: a2a: MLA latent communication runs under p2p, all_gather and a2a+p2p "
        "(Ulysses alone moves heads, not K/V blocks); set attention.cp_mla_latent: off or auto");
    const ContextParallel p2p{CommType::p2p, mesh.cp()};
    EXPECT_CPF_ERROR(context_parallel_mla_attention(dual_chunk_of(q, p2p),
                                                    dual_chunk_of(random_tensor({1, 4, 1, 6}, DType::f64, 4), p2p), w,
                                                    Tensor(), s, spec, std::nullopt, p2p),
                     "the MLA latent must be q's layout with one head of kv_lora_rank + qk_rope_head_dim = 5 values: "
                     "latent=[1,4,1,6]");
    EXPECT_CPF_ERROR(
        context_parallel_mla_attention(dual_chunk_of(q, p2p), dual_chunk_of(latent, p2p),
                                       random_tensor({10, 4}, DType::f64, 5), Tensor(), s, spec, std::nullopt, p2p),
        "the up-projection weight must be (num_heads x (qk_nope_head_dim + v_head_dim), kv_lora_rank) = "
        "[10, 3]: weight=[10,4]");
    EXPECT_CPF_ERROR(
        context_parallel_mla_attention(dual_chunk_of(q, p2p), dual_chunk_of(raw::to(latent, DType::f32), p2p), w,
                                       Tensor(), s, spec, std::nullopt, p2p),
        "q, the latent and the up-projection must share a dtype: q f64, latent f32, weight f64");
    (void)rc;
  });
}

}  // namespace
}  // namespace cpf::cp
