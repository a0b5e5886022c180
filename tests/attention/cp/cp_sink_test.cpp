// Attention sinks under context parallelism: every strategy (cp 2 and 4), format, causal / windowed /
// padding masks, MHA, GQA+MLA and MQA (KV heads replicated under Ulysses) against one rank: out,
// lse, dq, dk, dv of each shard, and d(sink) on every rank whole, as one rank gives it (CP attention
// sums the ranks' shares over the CP group itself). The sink counts once per row: a strategy that
// added it per ring step or per query chunk would change out and lse here.
#include <gtest/gtest.h>

#include "framework/tensor/ops/elementwise.h"
#include "tests/attention/cp/cp_grid.h"

namespace cpf::cp::testing {
namespace {

const MaskCase kMasks[] = {
    {"causal", MaskType::causal, {-1, 0}},
    {"causal_left3", MaskType::causal, {3, 0}},
    {"window_2_1", MaskType::no_mask, {2, 1}},
    {"padding_window_5_2", MaskType::padding, {5, 2}},
};

const HeadCase kHeads[] = {
    {"mha", 4, 4, 8, 8},
    {"gqa_mla", 4, 2, 8, 4},
    {"mqa", 4, 1, 6, 6},
};

using Param = GridParam;

std::vector<Param> grid() {
  std::vector<Param> params;
  for_each_strategy([&](CommType comm, int cp, QkvFormat format) {
    for (const MaskCase& mask : kMasks) {
      for (const HeadCase& heads : kHeads) params.push_back({comm, cp, format, mask, heads});
    }
  });
  return params;
}

class CpSink : public ::testing::TestWithParam<Param> {};

TEST_P(CpSink, ShardsAndSinkGradientEqualTheSingleRankResult) {
  const Param& p = GetParam();
  CpCase c = grid_case(p.comm, p.cp, p.format, p.mask.mask, p.mask.window, p.heads);
  c.sink = true;
  const CpQuery query = query_of(c);
  ASSERT_FALSE(unsupported_reason(query).has_value()) << *unsupported_reason(query);

  const Global g = make_global(c);
  const Tensors ref = reference(c, g);
  const auto cp = run_cp(c, g);
  expect_shards_equal_reference(c, g, ref, cp);
  for (int r = 0; r < c.cp; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const Tensors& got = cp[r];
    ASSERT_TRUE(got.dsink.defined()) << "no d(sink) on rank " << r;
    EXPECT_TRUE(::cpf::testing::all_close(got.dsink, ref.dsink, 1e-5, 1e-5)) << "d(sink) whole on every rank";
  }
}

INSTANTIATE_TEST_SUITE_P(EveryStrategy, CpSink, ::testing::ValuesIn(grid()), grid_param_name);

// A sink that does not match q's heads is refused before any communication.
TEST(CpSinkValidation, RejectsASinkOfTheWrongShape) {
  CpCase c;
  c.sink = true;
  Global g = make_global(c);
  g.sink = zeros({c.heads + 1}, {.dtype = DType::f32});
  EXPECT_CPF_ERROR(run_cp(c, g),
                   "context parallel (p2p): the attention sink must hold one logit per query head, "
                   "shape [4]: sink=[5]");
}

}  // namespace
}  // namespace cpf::cp::testing
