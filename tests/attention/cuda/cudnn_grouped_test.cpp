// thd calls run as one cuDNN execution per group of similar lengths (attention/cuda/cudnn/grouped_execution.h).
// Host parts (no GPU): the switch's values, the groups' Stats layout and the lse tables, checked on CPU
// tensors against the one-execution tables (attention/cuda/cudnn/row_fixups.h). GPU parts: packed documents of very
// different lengths give the same out, lse, dq, dk, dv grouped as in one execution, and both match the
// CPU reference within cudnn_test.cpp's tolerances (TransformerEngine's bf16 ones; lse 1e-5 relative).
// cuDNN's fused attention takes bf16 only (f32 goes to the unfused path, cudnn_test.cpp's
// ForcedCudnnRejectsF32WithTheReason), so the GPU cases are bf16.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "attention/attention_op.h"
#include "attention/attention_problem.h"
#include "attention/cuda/cudnn/document_groups.h"
#include "attention/cuda/cudnn/grouped_execution.h"
#include "attention/cuda/cudnn/problem_mapping.h"
#include "attention/cuda/cudnn/row_fixups.h"
#include "framework/core/error.h"
#include "framework/tensor/ops/copy.h"
#include "tests/tensor/cuda/cuda_test_utils.h"

namespace cpf::attention_cuda::cudnn {
namespace {

using ::cpf::testing::on_cpu;
using ::cpf::testing::on_gpu;
using ::cpf::testing::random_cpu;

// 4 documents of 8192 tokens among 40 of 128-1024 (gpu_cp_bench's long tail, smaller).
std::vector<int64_t> long_tailed_lengths() {
  std::vector<int64_t> lengths;
  for (int64_t i = 0; i < 44; ++i) lengths.push_back(i % 11 == 3 ? 8192 : 128 + (i * 211) % 897);
  return lengths;
}

AttentionProblem thd_problem(const SequenceInfo& info, int64_t h_q, int64_t h_kv, int64_t d) {
  const Tensor q = empty({info.q_storage_tokens(), h_q, d}, {.dtype = DType::bf16});
  const Tensor kv = empty({info.kv_storage_tokens(), h_kv, d}, {.dtype = DType::bf16});
  const AttentionSpec spec{.qkv_format = QkvFormat::thd, .mask = MaskType::padding_causal};
  return check_attention_inputs(q, kv, kv, spec, info, {});
}

// Restores the environment's grouping when a test ends, failed or not.
struct GroupingOverride {
  explicit GroupingOverride(int64_t call_rows) { set_thd_group_call_rows_for_testing(call_rows); }
  ~GroupingOverride() { set_thd_group_call_rows_for_testing(std::nullopt); }
};

TEST(CudnnThdGroupsSwitch, ParsesZeroOneAndUnset) {
  EXPECT_EQ(parse_thd_groups(nullptr), -1);  // off by default (attention/cuda/cudnn/grouped_execution.h says why)
  EXPECT_EQ(parse_thd_groups(""), -1);
  EXPECT_EQ(parse_thd_groups("1"), kGroupCallRows);
  EXPECT_EQ(parse_thd_groups("0"), -1);
}

TEST(CudnnThdGroupsSwitch, RejectsOtherValuesByName) {
  try {
    parse_thd_groups("yes");
    FAIL() << "expected a throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CPF_CUDNN_THD_GROUPS='yes' is not 0"), std::string::npos) << e.what();
  }
  try {
    set_thd_group_call_rows_for_testing(-2);
    FAIL() << "expected a throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("call_rows=-2 must be >= -1"), std::string::npos) << e.what();
  }
  const GroupingOverride off(-1);
  EXPECT_EQ(thd_group_call_rows(), -1);
}

TEST(CudnnThdGroupLayout, StatsOfEachGroupFollowOneAnother) {
  const SdpaMapping m = map_to_cudnn(thd_problem(SequenceInfo::from_lengths(long_tailed_lengths()), 3, 1, 64));
  ASSERT_EQ(m.reason, "");
  const std::vector<SdpaGroup> groups = group_entries_by_length(m);
  ASSERT_GT(groups.size(), 1u);
  const GroupLayout layout = group_layout(m, groups, 3);
  ASSERT_EQ(layout.mappings.size(), groups.size());
  int64_t offset = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    EXPECT_EQ(layout.stats_offset[g], offset);
    EXPECT_EQ(layout.stats_offset[g] % 128, 0) << "16-byte aligned Stats";
    offset += static_cast<int64_t>(groups[g].entries.size()) * 3 * groups[g].s_q;
  }
  EXPECT_EQ(layout.stats_numel, offset);
  EXPECT_LT(layout.stats_numel * 4, m.b * 3 * m.s_q) << "grouping must shrink Stats on this batch";
  try {
    group_layout(m, groups, 0);
    FAIL() << "expected a throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("h_q=0 must be positive"), std::string::npos) << e.what();
  }
}

TEST(CudnnThdGroupLayout, LseIndexRejectsEntriesOutsideTheCall) {
  const SdpaMapping m = map_to_cudnn(thd_problem(SequenceInfo::from_lengths({4000, 100, 130}), 2, 2, 64));
  const GroupLayout layout = group_layout(m, group_entries_by_length(m, 0), 2);
  try {
    grouped_lse_index(layout, 2, 4100);
    FAIL() << "expected a throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("outside the call's 4100"), std::string::npos) << e.what();
  }
}

// On CPU tensors: a packed lse goes to every group's Stats (padded_stats with the group's
// padded_to_packed, as the backward does) and back through the one gather (as the forward does); it
// must come back exactly at every token of an entry, as the one-execution tables give it.
TEST(CudnnThdGroupLayout, LseRoundTripsThroughTheGroupsStats) {
  const int64_t h = 3;
  const SequenceInfo info =
      SequenceInfo::from_cu_seqlens({0, 5000, 5100, 5400, 13400, 13500}, {0, 5008, 5108, 5408, 13408, 13600});
  const AttentionProblem p = thd_problem(info, h, 1, 64);
  const SdpaMapping m = map_to_cudnn(p);
  ASSERT_EQ(m.reason, "");
  const GroupLayout layout = group_layout(m, group_entries_by_length(m, 0), h);
  ASSERT_GT(layout.mappings.size(), 1u);
  const Tensor lse = random_cpu({h, p.s_q}, DType::f32, 5);  // (h, T)
  Tensor stats = zeros({layout.stats_numel}, {.dtype = DType::f32});
  auto flat = stats.to_vector<float>();
  for (size_t g = 0; g < layout.mappings.size(); ++g) {
    const SdpaMapping& gm = layout.mappings[g];
    const std::vector<int64_t> columns = padded_to_packed(gm);
    const Tensor padded = padded_stats(lse, from_vector(columns, {static_cast<int64_t>(columns.size())}), gm.b, gm.s_q);
    const auto v = padded.to_vector<float>();  // (b_g, h, s_g)
    std::copy(v.begin(), v.end(), flat.begin() + layout.stats_offset[g]);
  }
  stats = from_vector(flat, {layout.stats_numel});
  const std::vector<int64_t> index = grouped_lse_index(layout, h, p.s_q);
  const Tensor back = gathered_lse(stats, from_vector(index, {h * p.s_q}), h, p.s_q);
  ASSERT_EQ(back.shape(), (Shape{h, p.s_q}));
  const auto want = lse.to_vector<float>(), got = back.to_vector<float>();
  int64_t checked = 0;
  for (int64_t n = 0; n < m.b; ++n) {
    for (int64_t j = 0; j < m.seq_len_q[static_cast<size_t>(n)]; ++j) {
      for (int64_t hh = 0; hh < h; ++hh) {
        const auto e = static_cast<size_t>(hh * p.s_q + m.q_token[static_cast<size_t>(n)] + j);
        ASSERT_EQ(got[e], want[e]) << "head " << hh << ", entry " << n << ", query " << j;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, h * 13500);
}

struct Result {
  Tensor out, lse, dq, dk, dv;  // CPU
};

struct Inputs {
  SequenceInfo seq;
  Tensor q, k, v, dout;  // bf16, CPU: (T, h, d)
};

Inputs long_tailed_inputs(int64_t h_q, int64_t h_kv, int64_t d) {
  const SequenceInfo seq = SequenceInfo::from_lengths(long_tailed_lengths());
  const int64_t t = seq.q_storage_tokens();
  return {seq, random_cpu({t, h_q, d}, DType::bf16, 11), random_cpu({t, h_kv, d}, DType::bf16, 12),
          random_cpu({t, h_kv, d}, DType::bf16, 13), random_cpu({t, h_q, d}, DType::bf16, 14)};
}

const AttentionSpec kSpec{.qkv_format = QkvFormat::thd, .mask = MaskType::padding_causal};

Result run_cudnn(const Inputs& in, bool deterministic) {
  const AttentionKernelConfig config{.backend = AttentionBackend::cudnn, .deterministic = deterministic};
  const Tensor q = on_gpu(in.q), k = on_gpu(in.k), v = on_gpu(in.v);
  const raw::AttentionForward f = raw::attention_forward(q, k, v, kSpec, in.seq, config);
  const raw::AttentionGrads g =
      raw::attention_backward(on_gpu(in.dout), Tensor(), q, k, v, f.out, f.lse, kSpec, in.seq, config);
  return {on_cpu(f.out), on_cpu(f.lse), on_cpu(g.dq), on_cpu(g.dk), on_cpu(g.dv)};
}

// The f32 CPU flash kernels on the bf16 values widened to f32.
Result reference(const Inputs& in) {
  auto f32 = [](const Tensor& t) { return raw::to(t, DType::f32); };
  const raw::AttentionForward f = raw::attention_forward(f32(in.q), f32(in.k), f32(in.v), kSpec, in.seq);
  const raw::AttentionGrads g =
      raw::attention_backward(f32(in.dout), Tensor(), f32(in.q), f32(in.k), f32(in.v), f.out, f.lse, kSpec, in.seq);
  return {f.out, f.lse, g.dq, g.dk, g.dv};
}

// max |a - b| / max |b| <= tol (or, per_element, |a - b| <= tol max(1, |b|) per entry); no NaN and
// the same infinities.
::testing::AssertionResult close(const Tensor& got, const Tensor& want, double tol, bool per_element) {
  if (got.shape() != want.shape()) return ::testing::AssertionFailure() << "shape " << shape_str(got.shape());
  const auto a = got.to_vector<double>(), b = want.to_vector<double>();
  double max_err = 0, max_ref = 0, worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i])) return ::testing::AssertionFailure() << "NaN at element " << i;
    if (std::isinf(a[i]) || std::isinf(b[i])) {
      if (a[i] != b[i]) return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " vs " << b[i];
      continue;
    }
    const double err = std::abs(a[i] - b[i]);
    max_err = std::max(max_err, err);
    max_ref = std::max(max_ref, std::abs(b[i]));
    worst = std::max(worst, err / std::max(1.0, std::abs(b[i])));
  }
  const double score = per_element ? worst : max_err / std::max(max_ref, 1e-30);
  if (score > tol) return ::testing::AssertionFailure() << "error " << score << " > " << tol;
  return ::testing::AssertionSuccess() << "error " << score;
}

void expect_close(const Result& got, const Result& want, double tol, const std::string& what) {
  EXPECT_TRUE(close(got.out, want.out, tol, false)) << what << ": out";
  EXPECT_TRUE(close(got.lse, want.lse, 1e-5, true)) << what << ": lse";
  EXPECT_TRUE(close(got.dq, want.dq, tol, false)) << what << ": dq";
  EXPECT_TRUE(close(got.dk, want.dk, tol, false)) << what << ": dk";
  EXPECT_TRUE(close(got.dv, want.dv, tol, false)) << what << ": dv";
}

class CudnnThdGroups : public ::cpf::testing::CudaTest {};

// The default grouping and the finest one (call_rows 0) against one execution (-1) and the CPU
// reference, causal GQA.
TEST_F(CudnnThdGroups, LongTailedDocumentsMatchOneExecutionAndTheCpu) {
  const int64_t h_q = 4, h_kv = 2, d = 64;
  const double tol = 3.5e-2;  // GQA
  const Inputs in = long_tailed_inputs(h_q, h_kv, d);
  ASSERT_GT(group_entries_by_length(map_to_cudnn(thd_problem(in.seq, h_q, h_kv, d))).size(), 1u)
      << "the batch must be grouped by default";
  const Result ref = reference(in);
  std::optional<Result> one;
  {
    const GroupingOverride off(-1);
    one = run_cudnn(in, false);
  }
  expect_close(*one, ref, tol, "one execution vs CPU");
  for (const int64_t call_rows : {kGroupCallRows, int64_t{0}}) {
    const GroupingOverride rows(call_rows);
    const GroupedTablesStats before = grouped_tables_stats();
    const Result grouped = run_cudnn(in, false);
    const GroupedTablesStats after = grouped_tables_stats();
    const std::string what = "call_rows " + std::to_string(call_rows);
    EXPECT_EQ(after.builds + after.hits - before.builds - before.hits, 2u) << what << ": forward and backward";
    expect_close(grouped, ref, tol, "grouped vs CPU, " + what);
    // Against one execution: the same kernel per entry, so far tighter than the reference's bound.
    expect_close(grouped, *one, 1e-2, "grouped vs one execution, " + what);
  }
}

// The deterministic backward grouped: against the CPU, and bit for bit the same when repeated. (One
// execution is out of reach here: its dP workspace is O(b h s_q s_kv), 44 x 4 x 8192^2 elements.)
TEST_F(CudnnThdGroups, DeterministicBackwardGroupedMatchesTheCpuAndRepeats) {
  const Inputs in = long_tailed_inputs(4, 2, 64);
  const GroupingOverride rows(kGroupCallRows);
  const Result first = run_cudnn(in, true), second = run_cudnn(in, true);
  expect_close(first, reference(in), 3.5e-2, "grouped deterministic vs CPU");
  EXPECT_TRUE(close(second.dq, first.dq, 0, false)) << "dq repeated";
  EXPECT_TRUE(close(second.dk, first.dk, 0, false)) << "dk repeated";
  EXPECT_TRUE(close(second.dv, first.dv, 0, false)) << "dv repeated";
}

// A training step asks for the same calls again: the groups and their tables come from the cache.
TEST_F(CudnnThdGroups, RepeatedCallsReuseTheGroups) {
  const Inputs in = long_tailed_inputs(2, 2, 64);
  const GroupingOverride rows(kGroupCallRows);
  const Result first = run_cudnn(in, false);
  const GroupedTablesStats before = grouped_tables_stats();
  const Result second = run_cudnn(in, false);
  const GroupedTablesStats after = grouped_tables_stats();
  EXPECT_EQ(after.builds, before.builds);
  EXPECT_EQ(after.hits, before.hits + 2);
  expect_close(second, first, 1e-2, "second call vs first");
}

}  // namespace
}  // namespace cpf::attention_cuda::cudnn
