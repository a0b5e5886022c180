// Rejected inputs: every rank reaches the same verdict before any communication, with a message
// naming the values.
#include <gtest/gtest.h>

#include "attention/cp/cp_support.h"
#include "tests/attention/cp/cp_harness.h"

namespace cpf::cp::testing {
namespace {

// Runs `body(cp)` on two thread ranks with a flat CP group of `comm`.
void on_two_ranks(CommType comm, const std::function<void(const ContextParallel&)>& body) {
  dist::launch(2,
               [&](dist::RankContext& rc) {
                 dist::DeviceMesh mesh(rc.world, {.cp = 2, .require_cp = true});
                 body(ContextParallel{comm, mesh.cp(), nullptr, nullptr});
               },
               {.timeout = std::chrono::milliseconds(20'000)});
}

AttentionSpec bshd_causal() { return {.qkv_format = QkvFormat::bshd, .mask = MaskType::causal}; }

TEST(CpValidation, MissingGroup) {
  Tensor q = zeros({1, 4, 2, 4});
  EXPECT_CPF_ERROR(
      context_parallel_attention(dual_chunk_of(q, ContextParallel{}), dual_chunk_of(q, ContextParallel{}),
                                 dual_chunk_of(q, ContextParallel{}), bshd_causal(), std::nullopt, ContextParallel{}),
      "no CP group given (ContextParallel::group is null)");
}

TEST(CpValidation, ComputeStreamsIsOneOrTwo) {
  on_two_ranks(CommType::p2p, [](const ContextParallel& base) {
    ContextParallel cp = base;
    cp.compute_streams = 3;
    Tensor q = zeros({1, 4, 2, 4});
    EXPECT_CPF_ERROR(context_parallel_attention(dual_chunk_of(q, cp), dual_chunk_of(q, cp), dual_chunk_of(q, cp),
                                                bshd_causal(), std::nullopt, cp),
                     "context parallel (p2p): compute_streams must be 1 or 2, got 3");
  });
}

TEST(CpValidation, GroupOfSizeOneIsRefused) {
  dist::launch(1, [&](dist::RankContext& rc) {
    Tensor q = zeros({1, 4, 2, 4});
    EXPECT_CPF_ERROR(context_parallel_attention(
                         dual_chunk_of(q, ContextParallel{CommType::p2p, rc.world, nullptr, nullptr}),
                         dual_chunk_of(q, ContextParallel{CommType::p2p, rc.world, nullptr, nullptr}),
                         dual_chunk_of(q, ContextParallel{CommType::p2p, rc.world, nullptr, nullptr}), bshd_causal(),
                         std::nullopt, ContextParallel{CommType::p2p, rc.world, nullptr, nullptr}),
                     "the CP group has size 1; context parallelism needs at least 2 ranks");
  });
}

TEST(CpValidation, InconsistentShardsNameTheThreeShapes) {
  on_two_ranks(CommType::p2p, [](const ContextParallel& cp) {
    Tensor q = zeros({2, 4, 2, 4}), k = zeros({2, 4, 2, 4}), v = zeros({2, 6, 2, 4});
    EXPECT_CPF_ERROR(context_parallel_attention(dual_chunk_of(q, cp), dual_chunk_of(k, cp), dual_chunk_of(v, cp),
                                                bshd_causal(), std::nullopt, cp),
                     "Q, K and V must be sharded the same way along the sequence: q=[2,4,2,4] k=[2,4,2,4] v=[2,6,2,4]");
    Tensor k_batch = zeros({3, 4, 2, 4});
    EXPECT_CPF_ERROR(context_parallel_attention(dual_chunk_of(q, cp), dual_chunk_of(k_batch, cp),
                                                dual_chunk_of(k_batch, cp), bshd_causal(), std::nullopt, cp),
                     "q=[2,4,2,4] k=[3,4,2,4] v=[3,4,2,4]");
    EXPECT_CPF_ERROR(context_parallel_attention(dual_chunk_of(q, cp), dual_chunk_of(zeros({2, 4, 2}), cp),
                                                dual_chunk_of(q, cp), bshd_causal(), std::nullopt, cp),
                     "q, k and v must be 4-D for bshd");
    EXPECT_CPF_ERROR(
        context_parallel_attention(dual_chunk_of(q, cp), dual_chunk_of(zeros({2, 4, 2, 4}, {.dtype = DType::f64}), cp),
                                   dual_chunk_of(q, cp), bshd_causal(), std::nullopt, cp),
        "q, k and v dtypes differ: f32, f64, f32");
  });
}

TEST(CpValidation, SequenceNotDivisibleByTwiceTheCpSize) {
  on_two_ranks(CommType::all_gather, [](const ContextParallel& cp) {
    Tensor q = zeros({1, 3, 2, 4});
    EXPECT_CPF_ERROR(context_parallel_attention(dual_chunk_of(q, cp), dual_chunk_of(q, cp), dual_chunk_of(q, cp),
                                                bshd_causal(), std::nullopt, cp),
                     "local sequence length 3 must be even");
    // thd: every padded sequence must divide by 2P; real lengths are never rounded.
    AttentionSpec thd{.qkv_format = QkvFormat::thd, .mask = MaskType::padding_causal};
    Tensor t = zeros({5, 2, 4});
    EXPECT_CPF_ERROR(context_parallel_attention(dual_chunk_of(t, cp), dual_chunk_of(t, cp), dual_chunk_of(t, cp), thd,
                                                SequenceInfo::from_cu_seqlens({0, 5, 9}, {0, 6, 10}), cp),
                     "is not divisible by 2*cp_size=4");
  });
}

TEST(CpValidation, ThdNeedsGlobalPaddedMetadata) {
  on_two_ranks(CommType::p2p, [](const ContextParallel& cp) {
    AttentionSpec thd{.qkv_format = QkvFormat::thd, .mask = MaskType::padding_causal};
    Tensor t = zeros({4, 2, 4});
    EXPECT_CPF_ERROR(context_parallel_attention(dual_chunk_of(t, cp), dual_chunk_of(t, cp), dual_chunk_of(t, cp), thd,
                                                std::nullopt, cp),
                     "sequence info is required");
    EXPECT_CPF_ERROR(context_parallel_attention(dual_chunk_of(t, cp), dual_chunk_of(t, cp), dual_chunk_of(t, cp), thd,
                                                SequenceInfo::from_cu_seqlens({0, 4, 12}, {0, 4, 12}), cp),
                     "the local shard has 4 tokens but cu_seqlens_padded [0,4,12] over cp=2 needs 6");
    SequenceInfo cross = SequenceInfo::from_cu_seqlens({0, 3, 7}, {0, 4, 8}, {0, 4, 8}, {0, 4, 8});
    EXPECT_CPF_ERROR(
        context_parallel_attention(dual_chunk_of(t, cp), dual_chunk_of(t, cp), dual_chunk_of(t, cp), thd, cross, cp),
        "cross-attention");
  });
}

// A SequenceInfo given for bshd/sbhd (to carry positions, or a padding mask's lengths) must describe
// the global rows, as it must for dot_product_attention; before, CP ignored it without a padding mask.
TEST(CpValidation, RowSequenceInfoMustDescribeTheGlobalRows) {
  on_two_ranks(CommType::p2p, [](const ContextParallel& cp) {
    Tensor q = zeros({2, 4, 2, 4});  // global rows of 8 tokens
    EXPECT_CPF_ERROR(context_parallel_attention(dual_chunk_of(q, cp), dual_chunk_of(q, cp), dual_chunk_of(q, cp),
                                                bshd_causal(), SequenceInfo::from_lengths({5, 8}), cp),
                     "the sequence info's slots (cu_seqlens_q_padded=[0,5,13], cu_seqlens_kv_padded=[0,5,13]) must be "
                     "the 2 rows of the global sequence length 8 (local 4 x cp 2); build it with "
                     "SequenceInfo::from_lengths(lengths, 8)");
    EXPECT_CPF_ERROR(context_parallel_attention(dual_chunk_of(q, cp), dual_chunk_of(q, cp), dual_chunk_of(q, cp),
                                                bshd_causal(), SequenceInfo::from_lengths({5, 8}, 8), cp),
                     "mask causal treats every bshd row as one whole sequence, but the sequence info gives row 0 5 q "
                     "and 5 kv tokens of 8 (use a padding mask for shorter rows)");
    EXPECT_CPF_ERROR(context_parallel_attention(dual_chunk_of(q, cp), dual_chunk_of(q, cp), dual_chunk_of(q, cp),
                                                bshd_causal(), SequenceInfo::from_lengths({8}, 8), cp),
                     "sequence info describes 1 sequences for a batch of 2");
    SequenceInfo short_positions = SequenceInfo::from_lengths({8, 8}, 8);
    short_positions.q_positions = {0, 2, 4};
    EXPECT_CPF_ERROR(context_parallel_attention(dual_chunk_of(q, cp), dual_chunk_of(q, cp), dual_chunk_of(q, cp),
                                                bshd_causal(), short_positions, cp),
                     "SequenceInfo: q_positions has 3 entries but the storage holds 16 tokens");
  });
}

TEST(CpValidation, PaddingMaskNeedsLengths) {
  on_two_ranks(CommType::p2p, [](const ContextParallel& cp) {
    Tensor q = zeros({2, 4, 2, 4});
    AttentionSpec spec{.qkv_format = QkvFormat::bshd, .mask = MaskType::padding};
    EXPECT_CPF_ERROR(context_parallel_attention(dual_chunk_of(q, cp), dual_chunk_of(q, cp), dual_chunk_of(q, cp), spec,
                                                std::nullopt, cp),
                     "a padding mask needs sequence info with the real length of every row");
  });
}

TEST(CpValidation, UlyssesHeadsThatCannotSplit) {
  on_two_ranks(CommType::a2a, [](const ContextParallel& cp) {
    Tensor q = zeros({1, 4, 3, 4}), kv = zeros({1, 4, 3, 4});
    EXPECT_CPF_ERROR(context_parallel_attention(dual_chunk_of(q, cp), dual_chunk_of(kv, cp), dual_chunk_of(kv, cp),
                                                bshd_causal(), std::nullopt, cp),
                     "a2a: num_heads=3 is not divisible by the cp size=2");
  });
  CpQuery query{.comm_type = CommType::a2a, .cp_size = 4, .num_heads = 12, .num_kv_heads = 3};
  ASSERT_TRUE(unsupported_reason(query).has_value());
  EXPECT_NE(unsupported_reason(query)->find("num_kv_heads=3 is fewer than the cp size=4 and does not divide it"),
            std::string::npos)
      << *unsupported_reason(query);
  query.num_kv_heads = 6;
  EXPECT_NE(unsupported_reason(query)->find("num_kv_heads=6 is not divisible by the cp size=4"), std::string::npos)
      << *unsupported_reason(query);
  query.num_kv_heads = 2;  // fewer KV heads than ranks: replicated
  EXPECT_FALSE(unsupported_reason(query).has_value());
}

TEST(CpValidation, HierarchicalNeedsBothSubGroups) {
  on_two_ranks(CommType::a2a_p2p, [](const ContextParallel& cp) {
    Tensor q = zeros({1, 4, 2, 4});
    EXPECT_CPF_ERROR(context_parallel_attention(dual_chunk_of(q, cp), dual_chunk_of(q, cp), dual_chunk_of(q, cp),
                                                bshd_causal(), std::nullopt, cp),
                     "a2a+p2p: cp size 2 must split into a2a size 1 x p2p size, both at least 2");
  });
}

TEST(CpValidation, UnknownCommTypeListsTheValidOnes) {
  EXPECT_CPF_ERROR(parse_comm_type("ring"),
                   "unknown cp_comm_type 'ring' (expected one of p2p, all_gather, a2a, a2a+p2p)");
  EXPECT_EQ(parse_comm_type("a2a+p2p"), CommType::a2a_p2p);
}

TEST(CpValidation, CausalMaskCannotLookAhead) {
  CpQuery query{.comm_type = CommType::p2p, .cp_size = 2, .mask = MaskType::causal, .window = {4, 2}};
  ASSERT_TRUE(unsupported_reason(query).has_value());
  EXPECT_NE(unsupported_reason(query)->find("a causal mask cannot look ahead: window right=2"), std::string::npos);
}

}  // namespace
}  // namespace cpf::cp::testing
