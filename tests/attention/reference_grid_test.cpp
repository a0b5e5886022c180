// dot_product_attention against the naive oracle over the whole grid: mask x format x {MHA, GQA, MQA}
// x {d_qk = d_v, d_qk != d_v} x windows (none, left only, left + right, causal + left). Small tiles
// (3 x 2) so every case crosses tile boundaries, with full, partial and skipped tiles.
#include <gtest/gtest.h>

#include <sstream>
#include <tuple>

#include "tests/attention/attention_support.h"

namespace cpf {
namespace {

using testing::attention_shape;
using testing::random_tensor;

struct Heads {
  int64_t q, kv;
  const char* name;
};
struct Dims {
  int64_t qk, v;
};

struct GridCase {
  MaskType mask;
  QkvFormat format;
  Heads heads;
  Dims dims;
  AttentionWindow window;
};

std::string describe(const GridCase& c) {
  std::ostringstream os;
  os << mask_type_name(c.mask) << "_" << qkv_format_name(c.format) << "_" << c.heads.name << "_dqk" << c.dims.qk
     << "_dv" << c.dims.v << "_w" << (c.window.left < 0 ? "inf" : std::to_string(c.window.left)) << "_"
     << (c.window.right < 0 ? "inf" : std::to_string(c.window.right));
  return os.str();
}

std::string case_name(const ::testing::TestParamInfo<GridCase>& info) { return describe(info.param); }

// gtest prints parameters of failed cases with this instead of their bytes.
void PrintTo(const GridCase& c, std::ostream* os) { *os << describe(c); }

std::vector<GridCase> grid() {
  std::vector<GridCase> cases;
  const Heads heads[] = {{4, 4, "mha"}, {4, 2, "gqa"}, {4, 1, "mqa"}};
  const Dims dims[] = {{6, 6}, {6, 4}};
  const AttentionWindow windows[] = {{-1, -1}, {2, -1}, {2, 1}};
  for (MaskType mask : {MaskType::no_mask, MaskType::causal, MaskType::padding, MaskType::padding_causal}) {
    for (QkvFormat format : {QkvFormat::bshd, QkvFormat::sbhd, QkvFormat::thd}) {
      for (const Heads& h : heads) {
        for (const Dims& d : dims) {
          for (const AttentionWindow& w : windows) {
            if (is_causal(mask) && w.right > 0) continue;  // rejected combination (validation tests)
            cases.push_back({mask, format, h, d, w});
          }
        }
      }
    }
  }
  return cases;
}

// The sequences of each case: bshd/sbhd rows of 7 (padding masks: real lengths 5 and 7 on q, 6 and 3
// on kv); thd: lengths 4, 6, 1 with padding between them (slots 5, 6, 3).
std::optional<SequenceInfo> sequences(const GridCase& c) {
  if (c.format == QkvFormat::thd) {
    return SequenceInfo::from_cu_seqlens({0, 4, 10, 11}, {0, 5, 11, 14});
  }
  if (is_padding(c.mask)) return SequenceInfo::from_lengths({5, 7}, {6, 3}, 7, 7);
  return std::nullopt;
}

class AttentionGrid : public ::testing::TestWithParam<GridCase> {};

TEST_P(AttentionGrid, MatchesNaiveReferenceValuesAndGradients) {
  const GridCase& c = GetParam();
  const AttentionSpec spec{.qkv_format = c.format, .mask = c.mask, .window = c.window};
  const int64_t tokens = c.format == QkvFormat::thd ? 14 : 7;
  const Tensor q = random_tensor(attention_shape(c.format, 2, tokens, c.heads.q, c.dims.qk), DType::f64, 1);
  const Tensor k = random_tensor(attention_shape(c.format, 2, tokens, c.heads.kv, c.dims.qk), DType::f64, 2);
  const Tensor v = random_tensor(attention_shape(c.format, 2, tokens, c.heads.kv, c.dims.v), DType::f64, 3);
  const std::optional<SequenceInfo> seq = sequences(c);
  testing::expect_matches_reference(q, k, v, spec, seq, {.block_q = 3, .block_kv = 2});
  testing::expect_matches_reference(q, k, v, spec, seq,
                                    {.block_q = 2, .block_kv = 3, .backward = BackwardSchedule::split});
}

INSTANTIATE_TEST_SUITE_P(AllMasksFormatsHeads, AttentionGrid, ::testing::ValuesIn(grid()), case_name);

// Cross-attention (s_q != s_kv) in bshd: top-left aligned positions, with and without a causal mask.
TEST(AttentionCross, DifferentQueryAndKeyLengths) {
  for (MaskType mask : {MaskType::no_mask, MaskType::causal}) {
    const AttentionSpec spec{.qkv_format = QkvFormat::bshd, .mask = mask};
    const Tensor q = random_tensor({2, 5, 2, 4}, DType::f64, 4);
    const Tensor k = random_tensor({2, 9, 1, 4}, DType::f64, 5);
    const Tensor v = random_tensor({2, 9, 1, 3}, DType::f64, 6);
    testing::expect_matches_reference(q, k, v, spec, std::nullopt, {.block_q = 2, .block_kv = 4});
  }
}

}  // namespace
}  // namespace cpf
