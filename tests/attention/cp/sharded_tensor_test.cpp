// The sharding CP inputs carry (attention/cp/sharded_tensor.h): what the cutting functions tag, and
// every strategy refusing q, k, v cut differently (same shapes, other tokens) before communicating,
// with a message naming the sharding of q, k and v.
#include <gtest/gtest.h>

#include "attention/cp/sharded_tensor.h"
#include "tests/attention/cp/cp_harness.h"

namespace cpf::cp::testing {
namespace {

TEST(CpSharding, NamesSayWhichTokensARankHolds) {
  EXPECT_EQ(Sharding::dual_chunk(4, 1).str(), "dual_chunk(cp=4, rank=1: chunks 1 and 6 of 8)");
  EXPECT_EQ(Sharding::contiguous(4, 1).str(), "contiguous(cp=4, rank=1: block 1 of 4)");
  EXPECT_CPF_ERROR(Sharding::contiguous(2, 2), "Sharding::contiguous: rank=2 is outside a CP group of size 2");
  EXPECT_CPF_ERROR(Sharding::dual_chunk(2, -1), "rank=-1 is outside the CP group of size 2");
}

TEST(CpSharding, CuttingFunctionsTagWhatTheyCut) {
  const Tensor t = ::cpf::testing::random_tensor({2, 8, 3}, DType::f32, 11);  // (B, S, C)
  const ShardedTensor dual = dual_chunk_shard(t, 1, 2, 1);
  EXPECT_EQ(dual.sharding, Sharding::dual_chunk(2, 1));
  EXPECT_TRUE(::cpf::testing::all_close(dual.tensor, shard_sequence(t, 1, 2, 1), 0, 0));
  const ShardedTensor block = contiguous_shard(t, 1, 2, 1);
  EXPECT_EQ(block.sharding, Sharding::contiguous(2, 1));
  EXPECT_TRUE(::cpf::testing::all_close(block.tensor, raw::narrow(t, 1, 4, 4), 0, 0));
  EXPECT_CPF_ERROR(contiguous_shard(t, 1, 3, 0),
                   "contiguous_shard: length 8 along dim 1 is not divisible by cp_size=3");

  const Tensor packed = ::cpf::testing::random_tensor({8, 3}, DType::f32, 12);
  const ThdShard info = thd_shard({0, 5}, {0, 8}, 2, 0);
  const ShardedTensor tokens = dual_chunk_shard(packed, info);
  EXPECT_EQ(tokens.sharding, Sharding::dual_chunk(2, 0));
  EXPECT_TRUE(::cpf::testing::all_close(tokens.tensor, shard_tokens(packed, info), 0, 0));
}

// Runs `body(cp, rank)` on four thread ranks with the CP group (and sub-groups) of `comm`.
void on_four_ranks(CommType comm, const std::function<void(const ContextParallel&, int)>& body) {
  dist::launch(4,
               [&](dist::RankContext& rc) {
                 dist::MeshShape shape{.cp = 4, .require_cp = true};
                 if (comm == CommType::a2a_p2p) {
                   shape.cp_a2a = 2;
                   shape.hierarchical_cp = true;
                 }
                 dist::DeviceMesh mesh(rc.world, shape);
                 body(ContextParallel{comm, mesh.cp(), mesh.cp_a2a(), mesh.cp_p2p()}, rc.rank);
               },
               {.timeout = std::chrono::milliseconds(20'000)});
}

class CpShardingMismatch : public ::testing::TestWithParam<CommType> {};

// The founding bug: K/V cut into contiguous blocks, Q dual-chunk. Shapes agree, tokens do not.
TEST_P(CpShardingMismatch, ContiguousKvWithDualChunkQIsRefused) {
  const CommType comm = GetParam();
  const Tensor full = ::cpf::testing::random_tensor({1, 16, 4, 4}, DType::f32, 3);  // (B, S, H, D)
  const AttentionSpec spec{.qkv_format = QkvFormat::bshd, .mask = MaskType::causal};
  on_four_ranks(comm, [&](const ContextParallel& cp, int r) {
    const ShardedTensor q = dual_chunk_shard(full, 1, 4, r), kv = contiguous_shard(full, 1, 4, r);
    ASSERT_EQ(q.tensor.shape(), kv.tensor.shape());
    const std::string who = "context parallel (" + comm_type_name(comm) + "): ";
    const std::string dual = "dual_chunk(cp=4, rank=" + std::to_string(r) + ": chunks " + std::to_string(r) + " and " +
                             std::to_string(7 - r) + " of 8)";
    const std::string block = "contiguous(cp=4, rank=" + std::to_string(r) + ": block " + std::to_string(r) + " of 4)";
    EXPECT_CPF_ERROR(context_parallel_attention(q, kv, kv, spec, std::nullopt, cp),
                     who + "q, k and v are sharded differently along the sequence: q=" + dual + " k=" + block +
                         " v=" + block + "; cut all three with cp::dual_chunk_shard");
    // Only v cut differently.
    EXPECT_CPF_ERROR(context_parallel_attention(q, q, kv, spec, std::nullopt, cp),
                     "q=" + dual + " k=" + dual + " v=" + block);
    // All three contiguous: consistent, but not the layout any strategy computes on.
    EXPECT_CPF_ERROR(context_parallel_attention(kv, kv, kv, spec, std::nullopt, cp),
                     who + "q, k and v are sharded contiguous (q=" + block + " k=" + block + " v=" + block +
                         ") but context parallel attention needs the dual-chunk layout");
    // Cut for another rank of the group.
    const ShardedTensor other = dual_chunk_shard(full, 1, 4, (r + 1) % 4);
    EXPECT_CPF_ERROR(context_parallel_attention(other, other, other, spec, std::nullopt, cp),
                     who + "q, k and v are sharded for cp=4, rank=" + std::to_string((r + 1) % 4) +
                         " (q=" + other.sharding.str() + " k=" + other.sharding.str() + " v=" + other.sharding.str() +
                         ") but this is CP rank " + std::to_string(r) + " of a group of 4");
  });
}

// Cut for a CP group of another size, the same shapes (thd: the packed tokens of one sequence).
TEST_P(CpShardingMismatch, ShardsOfAnotherGroupSizeAreRefused) {
  const CommType comm = GetParam();
  const Tensor full = ::cpf::testing::random_tensor({16, 4, 4}, DType::f32, 4);  // (T, H, D)
  const AttentionSpec spec{.qkv_format = QkvFormat::thd, .mask = MaskType::padding_causal};
  on_four_ranks(comm, [&](const ContextParallel& cp, int r) {
    const ShardedTensor q = dual_chunk_shard(full, thd_shard({0, 16}, {0, 16}, 4, r));
    const ShardedTensor kv = dual_chunk_shard(raw::narrow(full, 0, 0, 8), thd_shard({0, 8}, {0, 8}, 2, r % 2));
    ASSERT_EQ(q.tensor.shape(), kv.tensor.shape());
    EXPECT_CPF_ERROR(context_parallel_attention(q, kv, kv, spec, SequenceInfo::from_cu_seqlens({0, 16}), cp),
                     "q, k and v are sharded differently along the sequence: q=" + q.sharding.str() +
                         " k=" + kv.sharding.str() + " v=" + kv.sharding.str());
  });
}

TEST_P(CpShardingMismatch, DualChunkShardsOfEveryInputRun) {
  CpCase c;
  c.comm = GetParam();
  c.cp = 4;
  c.a2a = c.comm == CommType::a2a_p2p ? 2 : 1;
  c.seq = 16;
  const Global g = make_global(c);
  const Tensors ref = reference(c, g);
  const auto cp = run_cp(c, g);  // the tagged overload
  for (int r = 0; r < c.cp; ++r) {
    EXPECT_TRUE(::cpf::testing::all_close(cp[r].out, shard(c, g, ref.out, g.seq_dim, r), 2e-6, 1e-5)) << "rank " << r;
    EXPECT_TRUE(::cpf::testing::all_close(cp[r].dk, shard(c, g, ref.dk, g.seq_dim, r), 2e-6, 1e-5)) << "rank " << r;
  }
}

std::string comm_name(const ::testing::TestParamInfo<CommType>& info) {
  return info.param == CommType::a2a_p2p ? "a2a_p2p" : comm_type_name(info.param);
}

INSTANTIATE_TEST_SUITE_P(EveryStrategy, CpShardingMismatch,
                         ::testing::Values(CommType::p2p, CommType::all_gather, CommType::a2a, CommType::a2a_p2p),
                         comm_name);

}  // namespace
}  // namespace cpf::cp::testing
