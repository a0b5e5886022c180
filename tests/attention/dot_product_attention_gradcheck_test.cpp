// f64 finite-difference gradcheck of dot_product_attention through both outputs (out and lse), on
// small shapes covering every format, GQA/MQA, d_qk != d_v, windows and padded storage.
#include <gtest/gtest.h>

#include <limits>

#include "attention/dot_product_attention.h"
#include "framework/autograd/ops.h"
#include "framework/tensor/ops/elementwise.h"
#include "support/gradcheck_utils.h"

namespace cpf {
namespace {

using testing::grad_input;
using Inputs = std::vector<Tensor>;

// out and lse, with lse's -inf entries (rows that see nothing) replaced by 0 so the contracted
// loss stays finite; their gradient is exactly zero either way.
GradcheckFn attention_fn(const AttentionSpec& spec, const std::optional<SequenceInfo>& seq) {
  return [=](const Inputs& x) {
    const AttentionOutput r = dot_product_attention(x[0], x[1], x[2], spec, seq, {.block_q = 2, .block_kv = 3});
    const Tensor finite = raw::compare(raw::CompareOp::gt, r.lse.detach(), -std::numeric_limits<double>::infinity());
    return Inputs{r.out, where(finite, r.lse, zeros({}, {.dtype = DType::f64}))};
  };
}

TEST(DotProductAttentionGradcheck, BshdCausalGqaWithDifferentValueDim) {
  const AttentionSpec spec{.qkv_format = QkvFormat::bshd, .mask = MaskType::causal};
  EXPECT_GRADCHECK(attention_fn(spec, std::nullopt),
                   (Inputs{grad_input({2, 5, 4, 3}, 1), grad_input({2, 5, 2, 3}, 2), grad_input({2, 5, 2, 2}, 3)}));
}

TEST(DotProductAttentionGradcheck, SbhdSlidingWindowMqa) {
  const AttentionSpec spec{.qkv_format = QkvFormat::sbhd, .window = {1, 2}, .softmax_scale = 0.7};
  EXPECT_GRADCHECK(attention_fn(spec, std::nullopt),
                   (Inputs{grad_input({6, 1, 3, 4}, 4), grad_input({6, 1, 1, 4}, 5), grad_input({6, 1, 1, 4}, 6)}));
}

TEST(DotProductAttentionGradcheck, ThdWithPaddingBetweenSequences) {
  // Lengths 3, 1, 0, 2 in slots of 4, 2, 1, 2; causal with a left window of 1.
  const SequenceInfo seq = SequenceInfo::from_cu_seqlens({0, 3, 4, 4, 6}, {0, 4, 6, 7, 9});
  const AttentionSpec spec{.qkv_format = QkvFormat::thd, .mask = MaskType::padding_causal, .window = {1, 0}};
  EXPECT_GRADCHECK(attention_fn(spec, seq),
                   (Inputs{grad_input({9, 2, 3}, 7), grad_input({9, 1, 3}, 8), grad_input({9, 1, 2}, 9)}));
}

TEST(DotProductAttentionGradcheck, BshdPaddingCrossAttentionWithPositionOffsets) {
  const SequenceInfo seq = SequenceInfo::from_lengths({3, 4}, {5, 2}, 4, 6).with_position_offsets(2, 0);
  const AttentionSpec spec{.qkv_format = QkvFormat::bshd, .mask = MaskType::padding_causal};
  EXPECT_GRADCHECK(attention_fn(spec, seq),
                   (Inputs{grad_input({2, 4, 2, 3}, 10), grad_input({2, 6, 2, 3}, 11), grad_input({2, 6, 2, 3}, 12)}));
}

}  // namespace
}  // namespace cpf
