// Every supported cell of the CP support matrix: out, lse, dq, dk, dv of each rank's shard equal the
// single-rank full-sequence result (fp32, |a - b| <= 2e-6 + 1e-5 |b|).
#include <gtest/gtest.h>

#include "tests/attention/cp/cp_grid.h"

namespace cpf::cp::testing {
namespace {

const MaskCase kMasks[] = {
    {"no_mask", MaskType::no_mask, {-1, -1}},
    {"causal", MaskType::causal, {-1, 0}},
    {"causal_left3", MaskType::causal, {3, 0}},
    {"window_2_1", MaskType::no_mask, {2, 1}},
    {"padding_causal", MaskType::padding_causal, {-1, 0}},
    {"padding_window_5_2", MaskType::padding, {5, 2}},
};

const HeadCase kHeads[] = {
    {"mha", 4, 4, 8, 8},
    {"gqa_mla", 4, 2, 8, 4},
    {"mqa", 4, 1, 6, 6},
    {"gqa_mla_wide", 8, 2, 4, 10},
};

// Head counts that some strategies reject (tested-rejected in cp_validation_test and cp_docs_test);
// the others must run them.
const HeadCase kOddHeads[] = {
    {"h6_kv6", 6, 6, 4, 4},
    {"h12_kv3", 12, 3, 4, 4},
};

using Param = GridParam;

std::vector<Param> grid() {
  std::vector<Param> params;
  for_each_strategy([&](CommType comm, int cp, QkvFormat format) {
    for (const MaskCase& mask : kMasks) {
      for (const HeadCase& heads : kHeads) params.push_back({comm, cp, format, mask, heads});
      if (mask.mask != MaskType::causal || mask.window.left != -1) continue;
      for (const HeadCase& heads : kOddHeads) {
        CpQuery q{comm,
                  cp,
                  comm == CommType::a2a_p2p ? 2 : 1,
                  format,
                  mask.mask,
                  mask.window,
                  heads.heads,
                  heads.kv_heads,
                  heads.d_qk,
                  heads.d_v,
                  false};
        if (!unsupported_reason(q)) params.push_back({comm, cp, format, mask, heads});
      }
    }
  });
  return params;
}

class CpEquivalence : public ::testing::TestWithParam<Param> {};

TEST_P(CpEquivalence, ShardsEqualTheSingleRankResult) {
  const Param& p = GetParam();
  CpCase c = grid_case(p.comm, p.cp, p.format, p.mask.mask, p.mask.window, p.heads);
  const CpQuery query = query_of(c);
  ASSERT_FALSE(unsupported_reason(query).has_value()) << *unsupported_reason(query);

  const Global g = make_global(c);
  const Tensors ref = reference(c, g);
  const auto cp = run_cp(c, g);
  expect_shards_equal_reference(c, g, ref, cp);
}

INSTANTIATE_TEST_SUITE_P(SupportMatrix, CpEquivalence, ::testing::ValuesIn(grid()), grid_param_name);

}  // namespace
}  // namespace cpf::cp::testing
