// row_tables (attention/cuda/cudnn/row_fixup_tables.h): the fix-up tables of a cuDNN mapping, built once
// per mapping object and stream and equal to what the per-call functions compute; a different mapping
// (other lengths or positions) gets its own. The host tests use the CPU device (no GPU needed); the
// GPU test runs cuDNN on ring-tile layouts A, B, A in a row against the CPU reference.
#include "attention/cuda/cudnn/row_fixup_tables.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <optional>
#include <vector>

#include "attention/attention_problem.h"
#include "attention/cuda/cudnn/problem_mapping_cache.h"
#include "attention/cuda/cudnn/row_fixups.h"
#include "framework/core/error.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/index.h"
#include "framework/tensor/ops/views.h"
#include "tests/attention/cuda/attention_gpu_support.h"

namespace cpf::attention_cuda::cudnn {
namespace {

// A thd causal tile over sequences of `lengths` (heads x 8 per token) whose queries sit `offset`
// positions before the keys (a ring tile's upper half: the first `offset` queries of each sequence
// see no key, so q_undefined has one run per sequence).
AttentionProblem tile(const std::vector<int64_t>& lengths, int64_t offset) {
  int64_t tokens = 0;
  for (int64_t n : lengths) tokens += n;
  const Tensor q = empty({tokens, 2, 8}, {.dtype = DType::bf16});
  const SequenceInfo seq = SequenceInfo::from_lengths(lengths).with_position_offsets(0, offset);
  const AttentionSpec spec{.qkv_format = QkvFormat::thd, .mask = MaskType::causal};
  return check_attention_inputs(q, q, q, spec, seq, {});
}

void expect_tables_of(const RowTables& t, const SdpaMapping& m, const AttentionProblem& p) {
  ASSERT_TRUE(m.padding) << "thd maps with the padding mask";
  EXPECT_EQ(t.seq_len_q.to_vector<int32_t>(), m.seq_len_q);
  EXPECT_EQ(t.seq_len_kv.to_vector<int32_t>(), m.seq_len_kv);
  // Dense (T, H, D) rows: q and o step h_q * d per token, k and v h_kv * d; small: i32.
  EXPECT_EQ(t.offset_row_strides,
            (std::array<int64_t, 4>{p.h_q * p.d_qk, p.h_kv * p.d_qk, p.h_kv * p.d_v, p.h_q * p.d_v}));
  EXPECT_FALSE(t.offsets_int64);
  EXPECT_EQ(t.offsets[0].to_vector<int32_t>(),
            ragged_offsets(m.q_token, p.s_q, p.h_q * p.d_qk, false).to_vector<int32_t>());
  EXPECT_EQ(t.offsets[1].to_vector<int32_t>(),
            ragged_offsets(m.kv_token, p.s_kv, p.h_kv * p.d_qk, false).to_vector<int32_t>());
  EXPECT_EQ(t.offsets[3].to_vector<int32_t>(),
            ragged_offsets(m.q_token, p.s_q, p.h_q * p.d_v, false).to_vector<int32_t>());
  EXPECT_EQ(t.q_runs, flag_runs(m.q_undefined, kMaxFillRuns));
  EXPECT_EQ(t.kv_runs, flag_runs(m.kv_undefined, kMaxFillRuns));
  ASSERT_TRUE(m.ragged);
  // packed_to_padded's n * s_q + j, as the column n * h_q * s_q + j of packed_lse's Stats view.
  std::vector<int64_t> lse_index;
  for (int64_t v : packed_to_padded(p, m)) lse_index.push_back((v / m.s_q) * p.h_q * m.s_q + v % m.s_q);
  EXPECT_EQ(t.lse_index.to_vector<int64_t>(), lse_index);
  EXPECT_EQ(t.stats_columns.to_vector<int64_t>(), padded_to_packed(m));
}

TEST(CudnnRowTables, TheSameMappingHitsAndMatchesThePerCallTables) {
  const AttentionProblem p = tile({40, 24}, 8);
  const auto m = cached_mapping(p);
  ASSERT_TRUE(m->reason.empty()) << m->reason;
  ASSERT_FALSE(m->q_undefined.empty()) << "the tile should leave query rows undefined";
  const auto before = row_tables_stats();
  const auto first = row_tables(m, p, Device::cpu());
  const auto second = row_tables(m, p, Device::cpu());
  EXPECT_EQ(row_tables_stats().builds - before.builds, 1u);
  EXPECT_EQ(row_tables_stats().hits - before.hits, 1u);
  EXPECT_EQ(first.get(), second.get());
  expect_tables_of(*second, *m, p);
  EXPECT_EQ(second->q_runs.size(), 2u) << "one run per sequence";
}

TEST(CudnnRowTables, DifferentLayoutsInARowGetTheirOwnTables) {
  const std::vector<AttentionProblem> problems{tile({40, 24}, 8), tile({24, 40}, 8), tile({40, 24}, 16), tile({64}, 0)};
  for (int round = 0; round < 2; ++round) {  // the second round is served from the cache
    for (const AttentionProblem& p : problems) {
      const auto m = cached_mapping(p);
      expect_tables_of(*row_tables(m, p, Device::cpu()), *m, p);
    }
  }
  const auto a = row_tables(cached_mapping(problems[0]), problems[0], Device::cpu());
  const auto b = row_tables(cached_mapping(problems[1]), problems[1], Device::cpu());
  EXPECT_NE(a.get(), b.get());
  EXPECT_NE(a->lse_index.to_vector<int64_t>(), b->lse_index.to_vector<int64_t>());
}

TEST(CudnnRowTables, KeyedByTheMappingObjectNotItsAddressAlone) {
  const AttentionProblem p = tile({40, 24}, 8);
  const auto cached = row_tables(cached_mapping(p), p, Device::cpu());
  // An equal mapping in another object: a miss (identity is the key), with equal tables.
  const auto other = std::make_shared<const SdpaMapping>(map_to_cudnn(p));
  const auto before = row_tables_stats();
  const auto rebuilt = row_tables(other, p, Device::cpu());
  EXPECT_EQ(row_tables_stats().builds - before.builds, 1u);
  EXPECT_NE(rebuilt.get(), cached.get());
  expect_tables_of(*rebuilt, *other, p);
}

TEST(CudnnRowTables, EvictsTheLeastRecentlyUsed) {
  const AttentionProblem first = tile({32}, 4);
  const auto m = cached_mapping(first);
  const auto kept = row_tables(m, first, Device::cpu());
  for (int64_t i = 0; i < static_cast<int64_t>(kRowTablesEntries); ++i) {
    const AttentionProblem p = tile({48 + 8 * i}, 4);
    row_tables(std::make_shared<const SdpaMapping>(map_to_cudnn(p)), p, Device::cpu());
  }
  const auto before = row_tables_stats();
  const auto again = row_tables(m, first, Device::cpu());
  EXPECT_EQ(row_tables_stats().builds - before.builds, 1u);
  EXPECT_NE(again.get(), kept.get());
  expect_tables_of(*again, *m, first);
}

TEST(CudnnRowTables, RaggedOffsetsAreTokenTimesRowStrideThenTheEnd) {
  const Tensor narrow = ragged_offsets({0, 40, 64}, 100, 16, false);
  EXPECT_EQ(narrow.dtype(), DType::i32);
  EXPECT_EQ(narrow.to_vector<int32_t>(), (std::vector<int32_t>{0, 640, 1024, 1600}));
  const Tensor wide = ragged_offsets({0, 3}, 5, int64_t{1} << 30, true);
  EXPECT_EQ(wide.dtype(), DType::i64);
  EXPECT_EQ(wide.to_vector<int64_t>(), (std::vector<int64_t>{0, int64_t{3} << 30, int64_t{5} << 30}));
}

TEST(CudnnRowTables, RejectsAMissingOrUnsupportedMapping) {
  const AttentionProblem p = tile({32}, 4);
  EXPECT_THAT([&] { row_tables(nullptr, p, Device::cpu()); },
              ::testing::ThrowsMessage<Error>(::testing::HasSubstr("cudnn row tables: no mapping")));
  auto unsupported = std::make_shared<SdpaMapping>();
  unsupported->reason = "a made-up reason";
  EXPECT_THAT([&] { row_tables(unsupported, p, Device::cpu()); },
              ::testing::ThrowsMessage<Error>(
                  ::testing::HasSubstr("cudnn row tables: the mapping is unsupported: a made-up reason")));
}

// The lse layout changes, each one gather, against the permute-and-select form they replace: the same
// values bit for bit (pure data movement). `device` runs them there; the expectation is on the CPU.
void expect_layout_changes_match(const Device& device) {
  const AttentionProblem p = tile({40, 24}, 8);
  const auto m = cached_mapping(p);
  const auto tables = row_tables(m, p, device);
  const Tensor stats = testing::random_cpu({m->b, p.h_q, m->s_q}, DType::f32, 11);  // (b, h_q, s)
  const Tensor lse = testing::random_cpu({p.h_q, p.s_q}, DType::f32, 12);           // (h_q, T)
  auto index = [](const std::vector<int64_t>& v) { return from_vector(v, {static_cast<int64_t>(v.size())}); };

  const Tensor rows = raw::reshape(raw::contiguous(raw::permute(stats, {1, 0, 2})), {p.h_q, m->b * m->s_q});
  const Tensor want_lse = raw::index_select(rows, 1, index(packed_to_padded(p, *m)));
  const Tensor got_lse = packed_lse(raw::to(stats, device), tables->lse_index);
  EXPECT_EQ(testing::on_cpu(got_lse).to_vector<float>(), want_lse.to_vector<float>());

  const Tensor padded = raw::index_select(lse, 1, index(padded_to_packed(*m)));
  const Tensor want_stats = raw::contiguous(raw::permute(raw::reshape(padded, {p.h_q, m->b, m->s_q}), {1, 0, 2}));
  const Tensor got_stats = padded_stats(raw::to(lse, device), tables->stats_columns, m->b, m->s_q);
  EXPECT_EQ(got_stats.shape(), want_stats.shape());
  EXPECT_EQ(testing::on_cpu(got_stats).to_vector<float>(), want_stats.to_vector<float>());
}

TEST(CudnnRowTables, OneGatherLayoutChangesMatchThePermutedForm) { expect_layout_changes_match(Device::cpu()); }

TEST(CudnnRowTables, LayoutChangesRejectBadInputsWithTheirShapes) {
  const Tensor index = from_vector(std::vector<int64_t>{0, 1}, {2});
  EXPECT_THAT(
      [&] {
        packed_lse(zeros({2, 3}), index);
      },
      ::testing::ThrowsMessage<Error>(::testing::HasSubstr("packed_lse: Stats must be a non-empty (b, h_q, s_q)")));
  EXPECT_THAT(
      [&] {
        packed_lse(zeros({1, 2, 3}), from_vector(std::vector<int32_t>{0, 1}, {2}));
      },
      ::testing::ThrowsMessage<Error>(::testing::HasSubstr("packed_lse: needs a contiguous input")));
  EXPECT_THAT(
      [&] {
        padded_stats(zeros({2, 5}), index, 1, 3);
      },
      ::testing::ThrowsMessage<Error>(::testing::HasSubstr("b * s_q = 3 indices, got lse [2,5] and 2 indices")));
}

class CudnnRowTablesGpu : public testing::CudaTest {};

TEST_F(CudnnRowTablesGpu, OneGatherLayoutChangesMatchTheCpu) { expect_layout_changes_match(Device::cuda(0)); }

// Two tile layouts alternating on one thread: each call must use its own lse index tables and fill
// runs (a stale entry would scatter the lse to the wrong tokens or zero the wrong rows).
TEST_F(CudnnRowTablesGpu, AlternatingLayoutsMatchTheCpuReference) {
  const AttentionKernelConfig cudnn_only{.backend = AttentionBackend::cudnn};
  struct Layout {
    std::vector<int64_t> lengths;
    int64_t offset;
  };
  const std::vector<Layout> layouts{{{96, 160}, 64}, {{160, 96}, 32}, {{96, 160}, 64}, {{256}, 0}};
  uint64_t seed = 7;
  for (const Layout& l : layouts) {
    int64_t tokens = 0;
    for (int64_t n : l.lengths) tokens += n;
    const SequenceInfo seq = SequenceInfo::from_lengths(l.lengths).with_position_offsets(0, l.offset);
    const AttentionSpec spec{.qkv_format = QkvFormat::thd, .mask = MaskType::causal};
    const Tensor q = testing::random_cpu({tokens, 4, 64}, DType::bf16, seed++);
    const Tensor k = testing::random_cpu({tokens, 4, 64}, DType::bf16, seed++);
    const Tensor v = testing::random_cpu({tokens, 4, 64}, DType::bf16, seed++);
    const Tensor dout = testing::random_cpu({tokens, 4, 64}, DType::bf16, seed++);
    const auto want = testing::run_attention_on(Device::cpu(), q, k, v, dout, Tensor(), spec, seq, {});
    const auto got = testing::run_attention_on(Device::cuda(0), q, k, v, dout, Tensor(), spec, seq, cudnn_only);
    testing::expect_results_close(
        got, want, {.values = testing::rtol_for(DType::bf16), .lse = 1e-5},
        "layout with " + std::to_string(l.lengths.size()) + " sequences, offset " + std::to_string(l.offset));
    testing::expect_exact_zeros_without_keys(check_attention_inputs(q, k, v, spec, seq, {}), got, "zeros");
  }
}

}  // namespace
}  // namespace cpf::attention_cuda::cudnn
