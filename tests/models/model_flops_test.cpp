// Model FLOPs per trained token (models/model_flops.h) against values worked out by hand.
#include <gtest/gtest.h>

#include <string>

#include "framework/core/error.h"
#include "models/model_flops.h"

namespace cpf::models {
namespace {

TEST(ModelFlops, Gpt2SmallIsPalmsFormula) {
  // GPT-2 124M: 12 layers, 12 heads of 64, T = 1024; 6N + 12 L H Q T (llm.c's figure for the shape).
  GPTOptions o;
  o.hidden_size = 768;
  o.num_layers = 12;
  o.num_heads = 12;
  const int64_t n = 124475904;
  const double expected = 6.0 * 124475904 + 12.0 * 12 * 12 * 64 * 1024;
  EXPECT_DOUBLE_EQ(training_flops_per_token(o, n, 1024), expected);
  o.head_dim = 64;  // explicit, the same
  EXPECT_DOUBLE_EQ(training_flops_per_token(o, n, 1024), expected);
}

TEST(ModelFlops, MlaCountsItsOwnQueryAndValueDims) {
  GPTOptions o;
  o.attention = AttentionType::mla;
  o.num_layers = 2;
  o.num_heads = 4;
  o.qk_nope_head_dim = 32;
  o.qk_rope_head_dim = 16;
  o.v_head_dim = 24;
  // 6N + 6 L H T (d_qk + d_v) with d_qk = 48, d_v = 24.
  EXPECT_DOUBLE_EQ(training_flops_per_token(o, 1000, 256), 6.0 * 1000 + 6.0 * 2 * 4 * 256 * (48 + 24));
}

TEST(ModelFlops, RejectsImpossibleShapes) {
  GPTOptions o;
  try {
    (void)training_flops_per_token(o, 10, 0);
    ADD_FAILURE() << "seq_len 0 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs num_parameters >= 0, seq_len >= 1 and num_heads >= 1, got 10, 0"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace cpf::models
