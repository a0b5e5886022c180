// Explicit positions on the global SequenceInfo travel with every token through every strategy:
// segment positions with gaps (2i), q/kv position offsets (with_position_offsets(3, 0)) and offsets
// that differ per sequence, with and without a sliding window, every format, MHA and GQA+MLA; each
// rank's out, lse, dq, dk, dv equal the single-rank result on its shard (fp32, |a - b| <= 2e-6 + 1e-5 |b|).
#include <gtest/gtest.h>

#include "tests/attention/cp/cp_grid.h"

namespace cpf::cp::testing {
namespace {

const MaskCase kMasks[] = {
    {"causal", MaskType::causal, {-1, 0}},
    {"causal_left3", MaskType::causal, {3, 0}},
    {"window_2_1", MaskType::no_mask, {2, 1}},
    {"padding_causal_left5", MaskType::padding_causal, {5, 0}},
    {"padding_window_5_2", MaskType::padding, {5, 2}},
};

const HeadCase kHeads[] = {
    {"mha", 4, 4, 8, 8},
    {"gqa_mla", 4, 2, 8, 4},
};

struct Param {
  CommType comm;
  int cp;
  QkvFormat format;
  Positions positions;
  MaskCase mask;
  HeadCase heads;
};

const char* positions_name(Positions positions) {
  switch (positions) {
    case Positions::gapped: return "gapped";
    case Positions::offsets: return "offsets";
    case Positions::sequence_offsets: return "sequence_offsets";
    case Positions::slot_index: break;
  }
  return "slot_index";
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const Param& p = info.param;
  std::ostringstream os;
  os << strategy_test_name(p.comm, p.cp, p.format) << "_" << positions_name(p.positions) << "_" << p.mask.name << "_"
     << p.heads.name;
  return os.str();
}

std::vector<Param> grid() {
  std::vector<Param> params;
  for_each_strategy([&](CommType comm, int cp, QkvFormat format) {
    for (Positions positions : {Positions::gapped, Positions::offsets, Positions::sequence_offsets}) {
      for (const MaskCase& mask : kMasks) {
        for (const HeadCase& heads : kHeads) params.push_back({comm, cp, format, positions, mask, heads});
      }
    }
  });
  return params;
}

// gtest would print a Param's bytes, padding included; its name says what it is.
void PrintTo(const Param& p, std::ostream* os) {
  *os << comm_type_name(p.comm) << " cp" << p.cp << " " << qkv_format_name(p.format) << " "
      << positions_name(p.positions) << " " << p.mask.name << " " << p.heads.name;
}

class CpExplicitPositions : public ::testing::TestWithParam<Param> {};

TEST_P(CpExplicitPositions, ShardsEqualTheSingleRankResult) {
  const Param& p = GetParam();
  CpCase c = grid_case(p.comm, p.cp, p.format, p.mask.mask, p.mask.window, p.heads);
  c.positions = p.positions;

  const Global g = make_global(c);
  ASSERT_TRUE(g.seq.has_value() && !g.seq->q_positions.empty() && !g.seq->kv_positions.empty());
  const Tensors ref = reference(c, g);
  const auto cp = run_cp(c, g);
  expect_shards_equal_reference(c, g, ref, cp);
}

INSTANTIATE_TEST_SUITE_P(GappedAndOffset, CpExplicitPositions, ::testing::ValuesIn(grid()), param_name);

// The issue's own case: segment_pos = 2i from SequenceInfo::from_segment_ids (one segment per bshd
// row), causal with a window of 3, every strategy on four ranks.
class CpSegmentPositions : public ::testing::TestWithParam<CommType> {};

TEST_P(CpSegmentPositions, GappedSegmentPositionsEqualTheSingleRankResult) {
  CpCase c;
  c.comm = GetParam();
  c.cp = 4;
  c.a2a = c.comm == CommType::a2a_p2p ? 2 : 1;
  c.window = {3, 0};
  c.seq = 32;
  Global g = make_global(c);
  std::vector<int64_t> ids, pos;
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t i = 0; i < c.seq; ++i) {
      ids.push_back(1);
      pos.push_back(2 * i);
    }
  }
  g.seq = SequenceInfo::from_segment_ids(spec_of(c), from_vector(ids, {c.batch, c.seq}),
                                         from_vector(pos, {c.batch, c.seq}));
  ASSERT_EQ(g.seq->q_positions, pos);
  const Tensors ref = reference(c, g);
  const auto cp = run_cp(c, g);
  expect_shards_equal_reference(c, g, ref, cp);
}

std::string comm_name(const ::testing::TestParamInfo<CommType>& info) {
  return info.param == CommType::a2a_p2p ? "a2a_p2p" : comm_type_name(info.param);
}

INSTANTIATE_TEST_SUITE_P(EveryStrategy, CpSegmentPositions,
                         ::testing::Values(CommType::p2p, CommType::all_gather, CommType::a2a, CommType::a2a_p2p),
                         comm_name);

}  // namespace
}  // namespace cpf::cp::testing
