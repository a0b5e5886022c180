// AttentionSpec: enum names round-trip, parse errors list the valid values, window/mask rules.
#include <gtest/gtest.h>

#include <cmath>

#include "attention/spec.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

TEST(AttentionSpec, EnumNamesRoundTrip) {
  for (QkvFormat f : {QkvFormat::bshd, QkvFormat::sbhd, QkvFormat::thd}) {
    EXPECT_EQ(parse_qkv_format(qkv_format_name(f)), f);
  }
  for (MaskType m : {MaskType::no_mask, MaskType::causal, MaskType::padding, MaskType::padding_causal}) {
    EXPECT_EQ(parse_mask_type(mask_type_name(m)), m);
  }
  EXPECT_EQ(mask_type_name(MaskType::padding_causal), "padding_causal");
  EXPECT_EQ(qkv_format_name(QkvFormat::sbhd), "sbhd");
}

TEST(AttentionSpec, UnknownNamesListTheValidOnes) {
  EXPECT_CPF_ERROR(parse_qkv_format("bhsd"), "unknown qkv_format 'bhsd' (valid: bshd, sbhd, thd)");
  EXPECT_CPF_ERROR(parse_mask_type("causal_bottom_right"),
                   "unknown mask 'causal_bottom_right' (valid: no_mask, causal, padding, padding_causal)");
}

TEST(AttentionSpec, CausalPinsTheRightWindowToZero) {
  EXPECT_EQ(effective_window({.mask = MaskType::causal}), (AttentionWindow{-1, 0}));
  EXPECT_EQ(effective_window({.mask = MaskType::padding_causal, .window = {16, -1}}), (AttentionWindow{16, 0}));
  EXPECT_EQ(effective_window({.mask = MaskType::padding, .window = {4, 2}}), (AttentionWindow{4, 2}));
  EXPECT_EQ(effective_window({}), (AttentionWindow{-1, -1}));
}

TEST(AttentionSpec, DefaultScaleIsInverseSqrtOfTheQkDim) {
  EXPECT_DOUBLE_EQ(softmax_scale({}, 64), 0.125);
  EXPECT_DOUBLE_EQ(softmax_scale({.softmax_scale = 0.3}, 64), 0.3);
}

TEST(AttentionSpec, StrNamesEveryKey) {
  const AttentionSpec spec{.qkv_format = QkvFormat::thd,
                           .mask = MaskType::causal,
                           .window = {8, 0},
                           .softmax_scale = 0.5,
                           .num_heads = 8,
                           .num_kv_heads = 2,
                           .head_dim_qk = 16,
                           .head_dim_v = 8};
  EXPECT_EQ(spec.str(),
            "qkv_format: thd, mask: causal, window: [8, 0], softmax_scale: 0.5, num_heads: 8, num_kv_heads: 2, "
            "head_dim_qk: 16, head_dim_v: 8");
}

TEST(AttentionSpec, RejectsContradictoryOptions) {
  EXPECT_CPF_ERROR(check_spec({.window = {-2, 0}}), "window entries must be >= -1 (-1 = unbounded): window=[-2, 0]");
  EXPECT_CPF_ERROR(check_spec({.mask = MaskType::causal, .window = {4, 2}}),
                   "mask causal sees no keys after the query, so the window must have right = 0 or -1: window=[4, 2]");
  EXPECT_CPF_ERROR(effective_window({.mask = MaskType::padding_causal, .window = {-1, 1}}),
                   "mask padding_causal sees no keys after the query");
  EXPECT_CPF_ERROR(check_spec({.num_heads = 6, .num_kv_heads = 4}),
                   "num_heads must be a multiple of num_kv_heads: num_heads=6 num_kv_heads=4");
  EXPECT_CPF_ERROR(check_spec({.num_heads = -1}), "head counts and dims must be >= 0");
  EXPECT_CPF_ERROR(check_spec({.softmax_scale = std::nan("")}), "softmax_scale must be finite");
  EXPECT_CPF_ERROR(softmax_scale({}, 0), "the default softmax_scale needs head_dim_qk > 0: head_dim_qk=0");
}

}  // namespace
}  // namespace cpf
