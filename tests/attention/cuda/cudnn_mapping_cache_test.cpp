// cached_mapping (attention/cuda/cudnn/problem_mapping_cache.h): the mapping map_to_cudnn builds, shared for
// an equal problem, built anew for any difference in the fields the key covers (lengths, positions,
// window, heads, format), and only the last few kept. Host logic: no GPU needed.
#include <gtest/gtest.h>

#include <optional>
#include <vector>

#include "attention/attention_problem.h"
#include "attention/cuda/cudnn/problem_mapping_cache.h"

namespace cpf::attention_cuda::cudnn {
namespace {

// A thd causal problem over sequences of `lengths` with heads x 8 per token; explicit positions
// shifted by `offset` (a ring tile's q side) when given.
AttentionProblem problem(const std::vector<int64_t>& lengths, int64_t offset = 0, int64_t heads = 2,
                         AttentionWindow window = {}) {
  int64_t tokens = 0;
  for (int64_t n : lengths) tokens += n;
  const Tensor q = empty({tokens, heads, 8}, {.dtype = DType::bf16});
  const SequenceInfo seq = SequenceInfo::from_lengths(lengths).with_position_offsets(offset, 0);
  const AttentionSpec spec{.qkv_format = QkvFormat::thd, .mask = MaskType::causal, .window = window};
  return check_attention_inputs(q, q, q, spec, seq, {});
}

void expect_same_mapping(const SdpaMapping& a, const SdpaMapping& b) {
  EXPECT_EQ(a.reason, b.reason);
  EXPECT_EQ(a.b, b.b);
  EXPECT_EQ(a.s_q, b.s_q);
  EXPECT_EQ(a.seq_len_q, b.seq_len_q);
  EXPECT_EQ(a.seq_len_kv, b.seq_len_kv);
  EXPECT_EQ(a.q_token, b.q_token);
  EXPECT_EQ(a.right, b.right);
  EXPECT_EQ(a.left_bound, b.left_bound);
  EXPECT_EQ(a.q_undefined, b.q_undefined);
  EXPECT_EQ(a.kv_undefined, b.kv_undefined);
}

TEST(CudnnMappingCache, EqualProblemsShareOneMapping) {
  const AttentionProblem p = problem({100, 60}, 40);
  const auto first = cached_mapping(p);
  expect_same_mapping(*first, map_to_cudnn(p));
  EXPECT_EQ(cached_mapping(problem({100, 60}, 40)).get(), first.get());
}

TEST(CudnnMappingCache, AnyDifferenceInTheKeyMapsAgain) {
  const AttentionProblem base = problem({100, 60}, 40);
  const auto mapped = cached_mapping(base);
  const std::vector<AttentionProblem> others{problem({100, 61}, 40), problem({60, 100}, 40), problem({100, 60}, 41),
                                             problem({100, 60}, 40, 4), problem({100, 60}, 40, 2, {16, 0})};
  for (const AttentionProblem& other : others) {
    const auto m = cached_mapping(other);
    EXPECT_NE(m.get(), mapped.get());
    expect_same_mapping(*m, map_to_cudnn(other));
  }
}

TEST(CudnnMappingCache, KeepsOnlyTheLastEntries) {
  const AttentionProblem oldest = problem({64});
  const auto first = cached_mapping(oldest);
  for (int64_t n = 1; n <= static_cast<int64_t>(kMappingCacheEntries); ++n) cached_mapping(problem({64 + n}));
  const auto again = cached_mapping(oldest);  // evicted: mapped anew, equal
  EXPECT_NE(again.get(), first.get());
  expect_same_mapping(*again, *first);
}

}  // namespace
}  // namespace cpf::attention_cuda::cudnn
