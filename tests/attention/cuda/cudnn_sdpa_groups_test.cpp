// thd calls split into groups of entries of similar lengths (attention/cuda/cudnn/document_groups.h): the
// cut is the cheapest, every entry lands in exactly one group whose dims hold it, the group mappings
// keep the parent's band, and on gpu_cp_bench's packed-documents batch the rows fall to about the
// tokens. Host logic only: no GPU needed.
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "attention/attention_problem.h"
#include "attention/cp/sharding.h"
#include "attention/cp/work_balance.h"
#include "attention/cuda/cudnn/document_groups.h"
#include "attention/cuda/cudnn/problem_mapping.h"
#include "framework/core/error.h"
#include "framework/tensor/tensor.h"

namespace cpf::attention_cuda::cudnn {
namespace {

// The mapping of one causal thd call over documents of `lengths` (each its own slot).
SdpaMapping thd_mapping(const std::vector<int64_t>& cu, const std::vector<int64_t>& cu_padded) {
  const SequenceInfo info = SequenceInfo::from_cu_seqlens(cu, cu_padded);
  const Tensor t = empty({info.q_storage_tokens(), 1, 8}, {.dtype = DType::bf16});
  const AttentionSpec spec{.qkv_format = QkvFormat::thd, .mask = MaskType::padding_causal};
  return map_to_cudnn(check_attention_inputs(t, t, t, spec, info, {}));
}

SdpaMapping thd_mapping(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> cu{0};
  for (int64_t len : lengths) cu.push_back(cu.back() + len);
  return thd_mapping(cu, cu);
}

int64_t total_rows(const std::vector<SdpaGroup>& groups) {
  int64_t rows = 0;
  for (const SdpaGroup& g : groups) rows += sdpa_rows(static_cast<int64_t>(g.entries.size()), g.s_q, g.s_kv);
  return rows;
}

// Every entry in exactly one group, in order within it, and each group's dims multiples of 128 that
// hold its entries' rounded lengths.
void expect_partition(const SdpaMapping& m, const std::vector<SdpaGroup>& groups) {
  std::set<int64_t> seen;
  for (const SdpaGroup& g : groups) {
    EXPECT_EQ(g.s_q % 128, 0);
    EXPECT_EQ(g.s_kv % 128, 0);
    EXPECT_TRUE(std::is_sorted(g.entries.begin(), g.entries.end()));
    for (int64_t i : g.entries) {
      EXPECT_TRUE(seen.insert(i).second) << "entry " << i << " in two groups";
      EXPECT_LE(m.seq_len_q[static_cast<size_t>(i)], g.s_q);
      EXPECT_LE(m.seq_len_kv[static_cast<size_t>(i)], g.s_kv);
    }
  }
  EXPECT_EQ(static_cast<int64_t>(seen.size()), m.b);
}

TEST(CudnnSdpaGroups, OneLongDocumentGoesApartFromTheShortOnes) {
  const SdpaMapping m = thd_mapping({4000, 100, 128, 120, 90});
  ASSERT_EQ(m.reason, "");
  ASSERT_EQ(m.s_q, 4096);
  const auto groups = group_entries_by_length(m, 0);
  expect_partition(m, groups);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].entries, (std::vector<int64_t>{0}));
  EXPECT_EQ(groups[0].s_q, 4096);
  EXPECT_EQ(groups[1].entries, (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(groups[1].s_q, 128);
  EXPECT_EQ(groups[1].s_kv, 128);
  EXPECT_EQ(total_rows(groups), sdpa_rows(1, 4096, 4096) + sdpa_rows(4, 128, 128));
}

TEST(CudnnSdpaGroups, AnExpensiveExecutionKeepsOneCall) {
  const SdpaMapping m = thd_mapping({4000, 100, 128, 120, 90});
  // Splitting saves 4 x 2 x (4096 - 128) rows; an execution worth more than that keeps one call.
  const auto groups = group_entries_by_length(m, 4 * 2 * (4096 - 128) + 1);
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].entries, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(groups[0].s_q, m.s_q);
  EXPECT_EQ(groups[0].s_kv, m.s_kv);
  // One row less and the split pays.
  EXPECT_EQ(group_entries_by_length(m, 4 * 2 * (4096 - 128) - 1).size(), 2u);
}

TEST(CudnnSdpaGroups, TheCutIsTheCheapest) {
  // Three length classes: every cut into consecutive runs, costed by hand, against the chosen one.
  const SdpaMapping m = thd_mapping({1000, 1000, 500, 500, 500, 100, 100, 100, 100});
  const int64_t call = 1000;
  auto cost = [&](const std::vector<std::pair<int64_t, int64_t>>& runs) {  // (entries, s) per run
    int64_t c = 0;
    for (auto [b, s] : runs) c += sdpa_rows(b, s, s) + call;
    return c;
  };
  const int64_t best = std::min({cost({{9, 1024}}), cost({{2, 1024}, {7, 512}}), cost({{5, 1024}, {4, 128}}),
                                 cost({{2, 1024}, {3, 512}, {4, 128}})});
  const auto groups = group_entries_by_length(m, call);
  expect_partition(m, groups);
  EXPECT_EQ(total_rows(groups) + call * static_cast<int64_t>(groups.size()), best);
}

TEST(CudnnSdpaGroups, NonRaggedAndSingleEntryCallsStayWhole) {
  SdpaMapping bshd;
  bshd.b = 2;
  bshd.s_q = bshd.s_kv = 256;
  bshd.seq_len_q = bshd.seq_len_kv = {256, 100};
  bshd.q_token = bshd.kv_token = {0, 256};
  const auto groups = group_entries_by_length(bshd, 0);
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].entries, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(group_entries_by_length(thd_mapping({300}), 0).size(), 1u);
}

TEST(CudnnSdpaGroups, GroupMappingKeepsTheBandAndDropsTheFixups) {
  const SdpaMapping m = thd_mapping({0, 4, 3904, 4004}, {0, 8, 4008, 4112});  // padded slots: undefined rows
  ASSERT_EQ(m.reason, "");
  ASSERT_FALSE(m.q_undefined.empty());
  const auto groups = group_entries_by_length(m, 0);
  ASSERT_EQ(groups.size(), 2u);
  const SdpaMapping g = group_mapping(m, groups[1]);
  EXPECT_EQ(g.b, 2);
  EXPECT_EQ(g.s_q, 128);
  EXPECT_EQ(g.seq_len_q, (std::vector<int32_t>{4, 100}));
  EXPECT_EQ(g.q_token, (std::vector<int64_t>{0, 4008}));
  EXPECT_EQ(g.kv_token, (std::vector<int64_t>{0, 4008}));
  EXPECT_EQ(g.ragged, m.ragged);
  EXPECT_EQ(g.padding, m.padding);
  EXPECT_EQ(g.right_bound, m.right_bound);
  EXPECT_EQ(g.right, m.right);
  EXPECT_EQ(g.bottom_right, m.bottom_right);
  EXPECT_TRUE(g.q_undefined.empty());
  EXPECT_TRUE(g.kv_undefined.empty());
}

TEST(CudnnSdpaGroups, BenchmarkBatchRowsFallToAboutTheTokens) {
  // gpu_cp_bench's packed-documents batch on 4 GPUs (cp_bench_thd.h): 85 documents, 262144 tokens.
  std::vector<int64_t> cu{0};
  for (int64_t len : cp::packed_document_lengths(4 * 65536, 1234)) cu.push_back(cu.back() + len);
  const std::vector<int64_t> padded = cp::pad_cu_seqlens(cu, 4);
  const SdpaMapping m = thd_mapping(cu, padded);
  ASSERT_EQ(m.reason, "");
  ASSERT_EQ(m.b, 85);
  const int64_t one_call = sdpa_rows(m.b, m.s_q, m.s_kv);
  EXPECT_GT(one_call, 10 * 2 * cu.back());  // b x s is 10.6 x the tokens on each side
  const auto groups = group_entries_by_length(m);
  expect_partition(m, groups);
  EXPECT_LE(groups.size(), 12u);
  EXPECT_LT(total_rows(groups), 3 * cu.back());  // both sides: under 1.5 x the tokens each
}

TEST(CudnnSdpaGroups, RejectsBadArguments) {
  const SdpaMapping m = thd_mapping({4000, 100});
  EXPECT_THROW(
      {
        try {
          group_entries_by_length(m, -1);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("call_rows=-1 must be >= 0"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
  auto message = [&](const SdpaGroup& g) {
    try {
      group_mapping(m, g);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message({{}, 128, 128}).find("a group without entries"), std::string::npos);
  EXPECT_NE(message({{2}, 128, 128}).find("entry 2 is not one of the mapping's 2"), std::string::npos);
  EXPECT_NE(message({{0}, 128, 128}).find("entry 0 has 4000 queries and 4000 keys, more than the group's s_q=128"),
            std::string::npos);
}

}  // namespace
}  // namespace cpf::attention_cuda::cudnn
