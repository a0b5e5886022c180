// Context-parallel attention inside a recomputed region (framework/autograd/checkpoint.h): what each
// recompute policy costs in messages. `full` re-runs the strategy's forward in the backward (the forward
// bytes are sent twice), `selective` keeps the attention's output and log-sum-exp and sends nothing
// again; the backward's messages and every gradient are those of the plain region, for each strategy.
#include <gtest/gtest.h>

#include <mutex>

#include "framework/autograd/checkpoint.h"
#include "framework/autograd/ops.h"
#include "support/test_utils.h"
#include "tests/attention/cp/cp_harness.h"

namespace cpf::cp::testing {
namespace {

using autograd::RecomputePolicy;

struct Measured {
  CpStats stats;
  std::vector<Tensor> grads;  // dq, dk, dv
};

Measured run_region(const ContextParallel& cp, int rank, std::optional<RecomputePolicy> policy) {
  Generator gen(static_cast<uint64_t>(7 + rank));
  std::vector<Tensor> qkv;
  for (int i = 0; i < 3; ++i) {
    qkv.push_back(uniform({1, 8, 2, 4}, -1, 1, {.dtype = DType::f64}, &gen));  // (B, S_local, H, D)
    qkv.back().set_requires_grad(true);
  }
  auto stats = std::make_shared<CpStats>();
  const AttentionSpec spec{.qkv_format = QkvFormat::bshd, .mask = MaskType::causal};
  auto region = [&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{context_parallel_attention(dual_chunk_of(in[0], cp), dual_chunk_of(in[1], cp),
                                                          dual_chunk_of(in[2], cp), spec, std::nullopt, cp, stats)
                                   .out};
  };
  const std::vector<Tensor> out =
      policy ? autograd::checkpoint(region, qkv, {.name = "attention", .policy = *policy, .params = {}}) : region(qkv);
  backward(sum(mul(out[0], out[0])));
  return {*stats, {qkv[0].grad(), qkv[1].grad(), qkv[2].grad()}};
}

TEST(CpRecompute, FullResendsTheForwardSelectiveSendsNothingAgain) {
  for (CommType comm : {CommType::p2p, CommType::all_gather, CommType::a2a}) {
    std::mutex mu;
    dist::launch(2, [&](dist::RankContext& rc) {
      dist::DeviceMesh mesh(rc.world, {.cp = 2, .require_cp = true});
      const ContextParallel cp{comm, mesh.cp(), nullptr, nullptr};
      const Measured plain = run_region(cp, rc.rank, std::nullopt);
      const Measured full = run_region(cp, rc.rank, RecomputePolicy::full);
      const Measured selective = run_region(cp, rc.rank, RecomputePolicy::selective);
      std::lock_guard<std::mutex> lock(mu);
      const std::string what = comm_type_name(comm) + " rank " + std::to_string(rc.rank);
      ASSERT_GT(plain.stats.forward_bytes_sent, 0) << what;
      EXPECT_EQ(full.stats.forward_bytes_sent, 2 * plain.stats.forward_bytes_sent) << what;
      EXPECT_EQ(selective.stats.forward_bytes_sent, plain.stats.forward_bytes_sent) << what;
      EXPECT_EQ(full.stats.backward_bytes_sent, plain.stats.backward_bytes_sent) << what;
      EXPECT_EQ(selective.stats.backward_bytes_sent, plain.stats.backward_bytes_sent) << what;
      for (size_t i = 0; i < 3; ++i) {
        EXPECT_TRUE(cpf::testing::all_close(full.grads[i], plain.grads[i], 0, 0)) << what;
        EXPECT_TRUE(cpf::testing::all_close(selective.grads[i], plain.grads[i], 0, 0)) << what;
      }
    });
  }
}

}  // namespace
}  // namespace cpf::cp::testing
