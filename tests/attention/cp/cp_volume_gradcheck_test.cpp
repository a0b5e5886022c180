// Bytes each rank sends, against the formulas in docs/cp.md; sliding-window ring steps skipped; and an
// f64 finite-difference check of each strategy across ranks (ranks perturb in turn, in lockstep).
#include <gtest/gtest.h>

#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/reduce.h"
#include "tests/attention/cp/cp_harness.h"

namespace cpf::cp::testing {
namespace {

CpCase volume_case(CommType comm, int cp) {
  CpCase c;
  c.comm = comm;
  c.cp = cp;
  c.a2a = comm == CommType::a2a_p2p ? 2 : 1;
  c.format = QkvFormat::bshd;
  c.mask = MaskType::causal;
  c.heads = 4;
  c.kv_heads = 2;
  c.d_qk = 8;
  c.d_v = 4;
  c.batch = 2;
  c.seq = 16 * cp;
  return c;
}

// Bytes of `tokens` tokens with `heads` x `dim` f32 values.
int64_t bytes(int64_t tokens, int64_t heads, int64_t dim) { return tokens * heads * dim * 4; }

TEST(CpVolume, BytesSentMatchTheFormulas) {
  for (CommType comm : {CommType::p2p, CommType::all_gather, CommType::a2a, CommType::a2a_p2p}) {
    const int cp = 4;
    const CpCase c = volume_case(comm, cp);
    std::vector<CpStats> stats;
    run_cp(c, make_global(c), &stats);
    const int64_t t = c.batch * c.seq / cp;  // local tokens
    const int64_t kv = bytes(t, c.kv_heads, c.d_qk + c.d_v);
    const int64_t q = bytes(t, c.heads, c.d_qk), o = bytes(t, c.heads, c.d_v), lse = bytes(t, c.heads, 1);
    int64_t fwd = 0, bwd = 0;
    switch (comm) {
      case CommType::p2p:  // KV around the ring; backward adds dKV (fp32) one hop behind
        fwd = (cp - 1) * kv;
        bwd = (cp - 1) * kv + cp * kv;
        break;
      case CommType::all_gather:  // all-gather KV (twice: backward re-gathers) + reduce-scatter dKV
        fwd = (cp - 1) * kv;
        bwd = (cp - 1) * kv + (cp - 1) * kv;
        break;
      case CommType::a2a: {  // (P-1)/P of q, k, v in and o, lse out; the same for the gradients
        const int64_t kv_rep = bytes(t, c.kv_heads * 2, c.d_qk + c.d_v);  // 2 KV heads replicated to 4
        fwd = (q + kv_rep + o + lse) * (cp - 1) / cp;
        bwd = (o + lse + q + kv_rep) * (cp - 1) / cp;
        break;
      }
      case CommType::a2a_p2p: {  // a2a within pairs (A = 2) + a ring of 2 over head halves
        const int a = 2, p = 2;
        const int64_t ring_kv = bytes(t * a, c.kv_heads / a, c.d_qk + c.d_v);
        fwd = (q + kv + o + lse) * (a - 1) / a + (p - 1) * ring_kv;
        bwd = (o + lse + q + kv) * (a - 1) / a + (p - 1) * ring_kv + p * ring_kv;
        break;
      }
    }
    for (int r = 0; r < cp; ++r) {
      EXPECT_EQ(stats[r].forward_bytes_sent, fwd) << comm_type_name(comm) << " rank " << r;
      EXPECT_EQ(stats[r].backward_bytes_sent, bwd) << comm_type_name(comm) << " rank " << r;
    }
  }
}

TEST(CpVolume, SlidingWindowRingSkipsStepsOutsideTheWindow) {
  CpCase c = volume_case(CommType::p2p, 4);
  c.window = {3, 0};  // chunk = 8 tokens: a query sees at most its own and the previous chunk
  std::vector<CpStats> stats;
  const Global g = make_global(c);
  const Tensors ref = reference(c, g);
  const auto got = run_cp(c, g, &stats);
  int64_t skipped = 0, steps = 0;
  for (const auto& s : stats) {
    skipped += s.ring_steps_skipped;
    steps += s.ring_steps;
  }
  EXPECT_EQ(steps, 16);
  // Rank r (chunks r, 7-r) needs only blocks holding chunk r-1 or 6-r: its own and one neighbour
  // (rank 0 and rank 3 need one more); every other step is skipped.
  EXPECT_GE(skipped, 6) << "of " << steps;
  for (int r = 0; r < c.cp; ++r) {
    EXPECT_TRUE(::cpf::testing::all_close(got[r].out, shard(c, g, ref.out, g.seq_dim, r), 2e-6, 1e-5));
  }
}

// Finite differences of L = sum over ranks of <w_r, out_r> + <u_r, lse_r> with respect to every
// input element of every rank, against the analytic gradient from backward. `window` {-1, 0} (plain
// causal) takes all_gather's overlapped path; `head_groups` > 1 pipelines a2a by head groups (4 KV
// heads then, so that every rank has 2).
void lockstep_gradcheck(CommType comm, AttentionWindow window = {5, 0}, int head_groups = 0) {
  CpCase c;
  c.comm = comm;
  c.cp = comm == CommType::a2a_p2p ? 4 : 2;
  c.a2a = comm == CommType::a2a_p2p ? 2 : 1;
  c.format = QkvFormat::thd;
  c.mask = MaskType::padding_causal;
  c.window = window;
  c.heads = 4;
  c.kv_heads = head_groups > 1 ? 4 : 2;
  c.d_qk = 3;
  c.d_v = 2;
  c.thd_lengths = {5, 3};
  c.dtype = DType::f64;
  const Global g = make_global(c);
  std::mutex failures_mutex;
  std::vector<std::string> failures;
  dist::launch(c.cp,
               [&](dist::RankContext& rc) {
                 dist::MeshShape shape{.cp = c.cp, .require_cp = true};
                 if (comm == CommType::a2a_p2p) {
                   shape.cp_a2a = 2;
                   shape.hierarchical_cp = true;
                 }
                 dist::DeviceMesh mesh(rc.world, shape);
                 ContextParallel cp{comm, mesh.cp(), mesh.cp_a2a(), mesh.cp_p2p()};
                 cp.a2a_head_groups = head_groups;
                 const int r = rc.rank;
                 std::vector<Tensor> inputs{shard(c, g, g.q, 0, r).set_requires_grad(),
                                            shard(c, g, g.k, 0, r).set_requires_grad(),
                                            shard(c, g, g.v, 0, r).set_requires_grad()};
                 const Tensor w = shard(c, g, g.dout, 0, r);
                 const Tensor u = shard(c, g, g.dlse, 1, r);
                 auto local_loss = [&]() {
                   auto [out, lse] =
                       context_parallel_attention(dual_chunk_of(inputs[0], cp), dual_chunk_of(inputs[1], cp),
                                                  dual_chunk_of(inputs[2], cp), spec_of(c), g.seq, cp);
                   // -inf lse rows (padding) contribute nothing.
                   Tensor finite = raw::compare(raw::CompareOp::gt, lse, -1e300);
                   Tensor lse_term = raw::where(finite, raw::mul(lse, u), zeros({}, {.dtype = DType::f64}));
                   return std::pair{out, lse};
                   (void)lse_term;
                 };
                 {
                   auto [out, lse] = local_loss();
                   Tensor finite = raw::compare(raw::CompareOp::gt, lse.detach(), -1e300);
                   backward({out, lse}, {w, raw::where(finite, u, zeros({}, {.dtype = DType::f64}))});
                 }
                 auto total_loss = [&]() {
                   NoGradGuard no_grad;
                   auto [out, lse] = local_loss();
                   Tensor finite = raw::compare(raw::CompareOp::gt, lse, -1e300);
                   double local =
                       raw::sum(raw::mul(out, w)).item<double>() +
                       raw::sum(raw::where(finite, raw::mul(lse, u), zeros({}, {.dtype = DType::f64}))).item<double>();
                   return rc.world->all_reduce(full({}, local, {.dtype = DType::f64})).item<double>();
                 };
                 const double eps = 1e-6;
                 for (int owner = 0; owner < c.cp; ++owner) {
                   for (size_t i = 0; i < inputs.size(); ++i) {
                     const int64_t n = inputs[i].numel();
                     Tensor grad = inputs[i].grad();
                     for (int64_t e = 0; e < n; ++e) {
                       double* x = inputs[i].data<double>() + e;
                       const double original = *x;
                       if (r == owner) *x = original + eps;
                       const double plus = total_loss();
                       if (r == owner) *x = original - eps;
                       const double minus = total_loss();
                       if (r == owner) *x = original;
                       if (r != owner) continue;
                       const double numeric = (plus - minus) / (2 * eps);
                       const double analytic = grad.defined() ? grad.data<double>()[e] : 0.0;
                       if (std::abs(numeric - analytic) > 1e-6 + 1e-5 * std::abs(numeric)) {
                         std::lock_guard<std::mutex> lock(failures_mutex);
                         failures.push_back("rank " + std::to_string(r) + " input " + std::to_string(i) + " element " +
                                            std::to_string(e) + ": analytic " + std::to_string(analytic) + " numeric " +
                                            std::to_string(numeric));
                       }
                     }
                   }
                 }
               },
               {.timeout = std::chrono::milliseconds(120'000)});
  EXPECT_TRUE(failures.empty()) << failures.size() << " mismatches, first: " << failures.front();
}

TEST(CpGradcheck, P2pF64) { lockstep_gradcheck(CommType::p2p); }
TEST(CpGradcheck, AllGatherF64) { lockstep_gradcheck(CommType::all_gather); }
TEST(CpGradcheck, A2aF64) { lockstep_gradcheck(CommType::a2a); }
TEST(CpGradcheck, A2aP2pF64) { lockstep_gradcheck(CommType::a2a_p2p); }
TEST(CpGradcheck, AllGatherOverlappedF64) { lockstep_gradcheck(CommType::all_gather, {-1, 0}); }
TEST(CpGradcheck, A2aHeadGroupsF64) { lockstep_gradcheck(CommType::a2a, {5, 0}, 2); }
TEST(CpGradcheck, A2aP2pHeadGroupsF64) { lockstep_gradcheck(CommType::a2a_p2p, {5, 0}, 2); }

}  // namespace
}  // namespace cpf::cp::testing
