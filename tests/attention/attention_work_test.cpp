// What attention reports to the profiler (profile::add_work, attention/attention_op.cpp): the FLOPs of the
// (query, key) pairs the mask lets through, 2 x pairs x heads x (d_qk + d_v) forward and
// 2 x pairs x heads x (3 d_qk + 2 d_v) backward, for a causal mask, a sliding window and packed sequences.
#include <gtest/gtest.h>

#include <map>

#include "attention/attention_op.h"
#include "framework/tensor/profile.h"
#include "framework/tensor/random.h"

namespace cpf {
namespace {

// The FLOPs one forward and one backward of `spec` on q (T, H, 4), k and v (T, H, 4) report.
std::pair<double, double> reported_flops(const AttentionSpec& spec, const SequenceInfo& seq, int64_t t, int64_t h) {
  Generator gen(3);
  const Tensor q = uniform({t, h, 4}, -1, 1, {}, &gen), k = uniform({t, h, 4}, -1, 1, {}, &gen),
               v = uniform({t, h, 4}, -1, 1, {}, &gen);
  profile::reset();
  profile::set_enabled(true);
  raw::AttentionForward f;
  {
    const profile::Scope scope("fwd");
    f = raw::attention_forward(q, k, v, spec, seq);
  }
  {
    const profile::Scope scope("bwd");
    raw::attention_backward(f.out, Tensor(), q, k, v, f.out, f.lse, spec, seq);
  }
  profile::set_enabled(false);
  std::map<std::string, double> flops;
  for (const profile::Stats& s : profile::snapshot()) flops[s.name] = s.flops;
  profile::reset();
  return {flops["fwd"], flops["bwd"]};
}

TEST(AttentionWork, CountsTheVisiblePairs) {
  AttentionSpec spec;
  spec.qkv_format = QkvFormat::thd;
  spec.mask = MaskType::causal;
  // One causal sequence of 8: 8 x 9 / 2 = 36 pairs; 2 heads, d_qk = d_v = 4.
  auto [fwd, bwd] = reported_flops(spec, SequenceInfo::from_lengths({8}), 8, 2);
  EXPECT_DOUBLE_EQ(fwd, 2.0 * 36 * 2 * 8);
  EXPECT_DOUBLE_EQ(bwd, 2.0 * 36 * 2 * 20);
  // Packed sequences of 5 and 3: 15 + 6 pairs.
  std::tie(fwd, bwd) = reported_flops(spec, SequenceInfo::from_lengths({5, 3}), 8, 2);
  EXPECT_DOUBLE_EQ(fwd, 2.0 * 21 * 2 * 8);
  // A window of 2 keys back: 1 + 2 + 3 x 6 = 21 pairs of the 8-token sequence.
  spec.window.left = 2;
  std::tie(fwd, bwd) = reported_flops(spec, SequenceInfo::from_lengths({8}), 8, 2);
  EXPECT_DOUBLE_EQ(fwd, 2.0 * 21 * 2 * 8);
  // No mask: every pair.
  spec = AttentionSpec{};
  spec.qkv_format = QkvFormat::thd;
  std::tie(fwd, bwd) = reported_flops(spec, SequenceInfo::from_lengths({8}), 8, 2);
  EXPECT_DOUBLE_EQ(fwd, 2.0 * 64 * 2 * 8);
}

}  // namespace
}  // namespace cpf
