// The unfused CUDA attention path against the CPU reference (attention/cpu): every feature the CPU
// kernels support, forward and backward (with and without a gradient on lse), in f32 (norm-wise
// 1e-5), f64 (1e-12) and bf16. bf16: both sides widen the same bf16 inputs to f32 and compute in f32;
// the GPU runs its GEMMs on TF32, exact for the bf16 inputs, rounding only P and dS (2^-11 relative per
// term). Rounding to bf16 then leaves each element equal or one bf16 step (2^-8 relative) apart, so the
// norm-wise error stays below 2^-8 + 2^-11 < rtol_for(bf16) = 2^-7. lse (f32, from the exact Q K^T)
// within 1e-5.
#include <gtest/gtest.h>

#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "attention/attention_problem.h"
#include "attention/cuda/unfused_attention.h"
#include "attention/dot_product_attention.h"
#include "framework/autograd/ops.h"
#include "framework/tensor/ops/elementwise.h"
#include "support/gradcheck_utils.h"
#include "tests/attention/attention_support.h"
#include "tests/attention/cuda/attention_gpu_support.h"

namespace cpf {
namespace {

using testing::attention_shape;
using testing::AttentionResult;

struct Case {
  std::string name;
  QkvFormat format = QkvFormat::bshd;
  MaskType mask = MaskType::no_mask;
  AttentionWindow window;
  int64_t batch = 2, s_q = 16, s_kv = 16;  // thd: s_q / s_kv are the storage tokens
  int64_t h_q = 4, h_kv = 4, d_qk = 16, d_v = 16;
  std::optional<SequenceInfo> seq;
  std::optional<double> scale;
};

AttentionSpec spec_of(const Case& c) {
  return {.qkv_format = c.format, .mask = c.mask, .window = c.window, .softmax_scale = c.scale};
}

std::vector<Case> cases() {
  using F = QkvFormat;
  using M = MaskType;
  std::vector<Case> cs;
  cs.push_back({.name = "bshd_no_mask_mha_odd_length", .batch = 2, .s_q = 37, .s_kv = 37});
  cs.push_back({.name = "bshd_causal_gqa",
                .mask = M::causal,
                .s_q = 64,
                .s_kv = 64,
                .h_q = 8,
                .h_kv = 2,
                .d_qk = 32,
                .d_v = 32});
  cs.push_back({.name = "sbhd_causal_mqa",
                .format = F::sbhd,
                .mask = M::causal,
                .batch = 3,
                .s_q = 24,
                .s_kv = 24,
                .h_q = 4,
                .h_kv = 1,
                .d_qk = 8,
                .d_v = 8});
  cs.push_back({.name = "bshd_causal_mla",
                .mask = M::causal,
                .s_q = 33,
                .s_kv = 33,
                .h_q = 4,
                .h_kv = 2,
                .d_qk = 24,
                .d_v = 16});
  cs.push_back({.name = "bshd_cross_no_mask", .s_q = 17, .s_kv = 45, .h_q = 2, .h_kv = 2, .d_qk = 8, .d_v = 8});
  cs.push_back({.name = "bshd_cross_causal_top_left", .mask = M::causal, .s_q = 50, .s_kv = 20, .h_q = 2, .h_kv = 1});
  cs.push_back({.name = "bshd_padding_causal",
                .mask = M::padding_causal,
                .s_q = 32,
                .s_kv = 32,
                .seq = SequenceInfo::from_lengths({13, 29}, 32)});
  cs.push_back({.name = "sbhd_padding_cross",
                .format = F::sbhd,
                .mask = M::padding,
                .s_q = 12,
                .s_kv = 10,
                .h_q = 2,
                .h_kv = 1,
                .seq = SequenceInfo::from_lengths({5, 11}, {9, 3}, 12, 10)});
  cs.push_back({.name = "bshd_sliding_window_causal", .mask = M::causal, .window = {5, 0}, .s_q = 40, .s_kv = 40});
  cs.push_back({.name = "sbhd_window_both_sides_gqa",
                .format = F::sbhd,
                .window = {3, 2},
                .s_q = 30,
                .s_kv = 30,
                .h_q = 6,
                .h_kv = 3,
                .d_qk = 8,
                .d_v = 12});
  cs.push_back({.name = "thd_causal_packed",
                .format = F::thd,
                .mask = M::causal,
                .s_q = 33,
                .s_kv = 33,
                .h_q = 4,
                .h_kv = 2,
                .seq = SequenceInfo::from_cu_seqlens({0, 5, 21, 22, 33})});
  cs.push_back({.name = "thd_padded_odd_window",
                .format = F::thd,
                .mask = M::padding_causal,
                .window = {2, 0},
                .s_q = 12,
                .s_kv = 12,
                .h_q = 3,
                .h_kv = 1,
                .d_qk = 12,
                .d_v = 8,
                .seq = SequenceInfo::from_cu_seqlens({0, 3, 4, 4, 9}, {0, 4, 6, 7, 12})});
  cs.push_back({.name = "thd_cross_padded",
                .format = F::thd,
                .s_q = 12,
                .s_kv = 13,
                .h_q = 2,
                .h_kv = 2,
                .seq = SequenceInfo::from_cu_seqlens({0, 3, 10}, {0, 8, 12}, {0, 4, 12}, {0, 8, 13})});
  // CP steps: explicit position offsets give full tiles, fully hidden tiles and shifted diagonals.
  cs.push_back({.name = "positions_full_tile",
                .mask = M::causal,
                .seq = SequenceInfo::from_lengths({16, 16}, 16).with_position_offsets(16, 0)});
  cs.push_back({.name = "positions_all_rows_masked",
                .mask = M::causal,
                .seq = SequenceInfo::from_lengths({16, 16}, 16).with_position_offsets(0, 16)});
  cs.push_back({.name = "positions_some_rows_masked",
                .mask = M::causal,
                .window = {4, 0},
                .seq = SequenceInfo::from_lengths({16, 16}, 16).with_position_offsets(0, 8)});
  cs.push_back({.name = "positions_thd_per_sequence",
                .format = F::thd,
                .mask = M::causal,
                .s_q = 14,
                .s_kv = 14,
                .h_q = 2,
                .h_kv = 1,
                .seq = SequenceInfo::from_cu_seqlens({0, 6, 14}).with_position_offsets({4, 0}, {0, 3})});
  // Arbitrary (non-monotonic) positions: what a load-balanced CP layout can ask for.
  cs.push_back({.name = "positions_arbitrary",
                .mask = M::causal,
                .batch = 1,
                .s_q = 8,
                .s_kv = 8,
                .h_q = 2,
                .h_kv = 2,
                .seq = SequenceInfo::from_lengths({8}, 8).with_positions({7, 0, 3, 12, 5, 9, 1, 4},
                                                                         {2, 8, 0, 11, 6, 3, 13, 5})});
  cs.push_back({.name = "long_rows_causal",
                .mask = M::causal,
                .batch = 1,
                .s_q = 300,
                .s_kv = 300,
                .h_q = 2,
                .h_kv = 1,
                .d_qk = 64,
                .d_v = 64});
  // Longer than kSkipRowBlock (512): row blocks that skip the keys they cannot see.
  cs.push_back({.name = "row_blocks_causal",
                .mask = M::causal,
                .batch = 1,
                .s_q = 1100,
                .s_kv = 1100,
                .h_q = 2,
                .h_kv = 1,
                .d_qk = 32,
                .d_v = 32});
  cs.push_back({.name = "row_blocks_sliding_window_thd",
                .format = F::thd,
                .mask = M::causal,
                .window = {100, 0},
                .s_q = 1300,
                .s_kv = 1300,
                .h_q = 2,
                .h_kv = 2,
                .d_qk = 16,
                .d_v = 16,
                .seq = SequenceInfo::from_cu_seqlens({0, 1100, 1300})});
  // Rows longer than the softmax keeps in registers (8192 scores): the three-pass kernel.
  std::vector<int64_t> q_far(5), kv_reversed(9000);
  for (int64_t i = 0; i < 5; ++i) q_far[static_cast<size_t>(i)] = 8000 + i;
  for (int64_t i = 0; i < 9000; ++i) kv_reversed[static_cast<size_t>(i)] = 8999 - i;
  cs.push_back(
      {.name = "long_keys_no_mask", .batch = 1, .s_q = 3, .s_kv = 9000, .h_q = 2, .h_kv = 1, .d_qk = 8, .d_v = 8});
  cs.push_back({.name = "long_keys_unsorted_window",
                .window = {4000, 100},
                .batch = 1,
                .s_q = 5,
                .s_kv = 9000,
                .h_q = 1,
                .h_kv = 1,
                .d_qk = 8,
                .d_v = 8,
                .seq = SequenceInfo::from_lengths({5}, {9000}, 5, 9000).with_positions(q_far, kv_reversed)});
  cs.push_back({.name = "custom_scale", .s_q = 9, .s_kv = 9, .scale = 0.3});
  return cs;
}

struct Inputs {
  Tensor q, k, v, dout, dlse;  // on the CPU, in the case's dtype (dlse: the lse dtype)
};

Inputs make_inputs(const Case& c, DType dtype, uint64_t seed) {
  Inputs in;
  in.q = testing::random_cpu(attention_shape(c.format, c.batch, c.s_q, c.h_q, c.d_qk), dtype, seed);
  in.k = testing::random_cpu(attention_shape(c.format, c.batch, c.s_kv, c.h_kv, c.d_qk), dtype, seed + 1);
  in.v = testing::random_cpu(attention_shape(c.format, c.batch, c.s_kv, c.h_kv, c.d_v), dtype, seed + 2);
  in.dout = testing::random_cpu(attention_shape(c.format, c.batch, c.s_q, c.h_q, c.d_v), dtype, seed + 3);
  const Shape lse_shape = c.format == QkvFormat::thd ? Shape{c.h_q, c.s_q} : Shape{c.batch, c.h_q, c.s_q};
  in.dlse = testing::random_cpu(lse_shape, dtype == DType::f64 ? DType::f64 : DType::f32, seed + 4);
  return in;
}

testing::AttentionTolerance tolerance_for(DType dtype) {
  if (dtype == DType::bf16) return {.values = testing::rtol_for(DType::bf16), .lse = 1e-5};
  return {.values = testing::rtol_for(dtype), .lse = testing::rtol_for(dtype)};
}

const AttentionKernelConfig kUnfused{.backend = AttentionBackend::unfused};

class UnfusedAttention : public testing::CudaTest {
 protected:
  void SetUp() override {
    testing::CudaTest::SetUp();
    unsetenv("CPF_ATTENTION_BACKEND");  // the config below must decide
  }
};

struct GridParam {
  Case c;
  DType dtype;
};
std::string param_name(const ::testing::TestParamInfo<GridParam>& info) {
  return info.param.c.name + "_" + dtype_name(info.param.dtype);
}
void PrintTo(const GridParam& p, std::ostream* os) { *os << p.c.name << " " << dtype_name(p.dtype); }

std::vector<GridParam> grid() {
  std::vector<GridParam> params;
  for (const Case& c : cases()) {
    for (DType dtype : {DType::f32, DType::f64, DType::bf16}) params.push_back({c, dtype});
  }
  return params;
}

class UnfusedGrid : public ::testing::WithParamInterface<GridParam>, public UnfusedAttention {};

TEST_P(UnfusedGrid, MatchesCpuReferenceWithAndWithoutDlse) {
  const Case& c = GetParam().c;
  const DType dtype = GetParam().dtype;
  const Inputs in = make_inputs(c, dtype, 11);
  for (bool with_dlse : {true, false}) {
    const Tensor dlse = with_dlse ? in.dlse : Tensor();
    const AttentionResult want =
        testing::run_attention_on(Device::cpu(), in.q, in.k, in.v, in.dout, dlse, spec_of(c), c.seq, {});
    const AttentionResult got =
        testing::run_attention_on(Device::cuda(0), in.q, in.k, in.v, in.dout, dlse, spec_of(c), c.seq, kUnfused);
    const std::string what = c.name + " " + dtype_name(dtype) + (with_dlse ? " with dlse" : " without dlse");
    testing::expect_results_close(got, want, tolerance_for(dtype), what);
    testing::expect_exact_zeros_without_keys(check_attention_inputs(in.q, in.k, in.v, spec_of(c), c.seq, {}), got,
                                             what);
  }
}

INSTANTIATE_TEST_SUITE_P(EveryFeature, UnfusedGrid, ::testing::ValuesIn(grid()), param_name);

// Score buffers smaller than one sequence: row slices of one head, several heads per chunk, and a
// budget of one row. Compared with the CPU reference (the summation order of dK/dV changes).
TEST_F(UnfusedAttention, ChunkedWorkspacesMatchTheReference) {
  for (const Case& c : cases()) {
    if (c.name != "bshd_causal_gqa" && c.name != "thd_padded_odd_window" && c.name != "bshd_cross_no_mask" &&
        c.name != "row_blocks_causal") {
      continue;
    }
    const Inputs in = make_inputs(c, DType::f32, 21);
    const AttentionResult want =
        testing::run_attention_on(Device::cpu(), in.q, in.k, in.v, in.dout, in.dlse, spec_of(c), c.seq, {});
    const Tensor q = testing::on_gpu(in.q), k = testing::on_gpu(in.k), v = testing::on_gpu(in.v);
    const AttentionProblem p = check_attention_inputs(q, k, v, spec_of(c), c.seq, kUnfused);
    // kv_len x 4 bytes x 2 buffers per score row: 1 row, 5 rows, 1.5 sequences' worth of one head.
    const size_t row_bytes = static_cast<size_t>(p.s_kv) * 4 * 2;
    for (size_t budget : {size_t(1), 5 * row_bytes, (3 * row_bytes * static_cast<size_t>(p.s_q)) / 2}) {
      const attention_cuda::unfused::Options options{.workspace_bytes = budget};
      const raw::AttentionForward f = attention_cuda::unfused::forward(p, q, k, v, options);
      const raw::AttentionGrads g = attention_cuda::unfused::backward(
          p, testing::on_gpu(in.dout), testing::on_gpu(in.dlse), q, k, v, f.out, f.lse, options);
      testing::expect_results_close({f.out, f.lse, g.dq, g.dk, g.dv}, want, tolerance_for(DType::f32),
                                    c.name + " with a workspace of " + std::to_string(budget) + " bytes");
    }
  }
}

// No atomics: repeated calls (reusing cached buffers) give bitwise equal results.
TEST_F(UnfusedAttention, BackwardIsDeterministicAcrossRepeatedCalls) {
  Case c = cases()[1];  // bshd causal GQA: dK/dV summed over 4 query heads
  const Inputs in = make_inputs(c, DType::f32, 31);
  const AttentionResult first =
      testing::run_attention_on(Device::cuda(0), in.q, in.k, in.v, in.dout, in.dlse, spec_of(c), c.seq, kUnfused);
  for (int i = 0; i < 3; ++i) {
    const AttentionResult again =
        testing::run_attention_on(Device::cuda(0), in.q, in.k, in.v, in.dout, in.dlse, spec_of(c), c.seq, kUnfused);
    EXPECT_TRUE(testing::bitwise_equal(again.out, first.out)) << "out, repeat " << i;
    EXPECT_TRUE(testing::bitwise_equal(again.lse, first.lse)) << "lse, repeat " << i;
    EXPECT_TRUE(testing::bitwise_equal(again.dq, first.dq)) << "dq, repeat " << i;
    EXPECT_TRUE(testing::bitwise_equal(again.dk, first.dk)) << "dk, repeat " << i;
    EXPECT_TRUE(testing::bitwise_equal(again.dv, first.dv)) << "dv, repeat " << i;
  }
}

// Rows that see no key: out 0, lse -inf, zero gradients and no NaN anywhere (checked element-wise
// by close_to_reference, and here explicitly).
TEST_F(UnfusedAttention, FullyMaskedRowsGiveZeroOutputAndMinusInfinityLse) {
  const Case c = cases()[14];  // positions_all_rows_masked
  ASSERT_EQ(c.name, "positions_all_rows_masked");
  const Inputs in = make_inputs(c, DType::f32, 41);
  const AttentionResult got =
      testing::run_attention_on(Device::cuda(0), in.q, in.k, in.v, in.dout, in.dlse, spec_of(c), c.seq, kUnfused);
  for (double x : got.out.to_vector<double>()) ASSERT_EQ(x, 0.0);
  for (double x : got.lse.to_vector<double>()) ASSERT_EQ(x, -std::numeric_limits<double>::infinity());
  for (const Tensor* t : {&got.dq, &got.dk, &got.dv}) {
    for (double x : t->to_vector<double>()) ASSERT_EQ(x, 0.0);
  }
}

TEST_F(UnfusedAttention, RejectsAnEmptyValueHeadDim) {
  const Tensor q = zeros({1, 4, 2, 3}, {.device = Device::cuda(0)});
  const Tensor v = zeros({1, 4, 2, 0}, {.device = Device::cuda(0)});
  const AttentionProblem p = check_attention_inputs(q, q, v, {}, std::nullopt, kUnfused);
  EXPECT_CPF_ERROR(attention_cuda::unfused::forward(p, q, q, v), "head dims must be positive: d_qk=3 d_v=0");
}

// Needs no GPU: the check runs before any CUDA call.
TEST(UnfusedAttentionInputs, RejectsCpuTensors) {
  const Tensor q = zeros({1, 4, 2, 3});
  const AttentionProblem p = check_attention_inputs(q, q, q, {}, std::nullopt, kUnfused);
  EXPECT_CPF_ERROR(attention_cuda::unfused::forward(p, q, q, q), "the unfused CUDA path needs CUDA tensors, got cpu");
  EXPECT_CPF_ERROR(attention_cuda::unfused::backward(p, q, Tensor(), q, q, q, q, q),
                   "the unfused CUDA path needs CUDA tensors");
}

// f64 finite differences of dot_product_attention on CUDA tensors, through out and lse (lse's -inf
// entries replaced by 0 so the contracted loss stays finite; their gradient is zero either way).
GradcheckFn attention_fn(const AttentionSpec& spec, const std::optional<SequenceInfo>& seq) {
  return [=](const std::vector<Tensor>& x) {
    const AttentionOutput r = dot_product_attention(x[0], x[1], x[2], spec, seq, kUnfused);
    const Tensor finite = raw::compare(raw::CompareOp::gt, r.lse.detach(), -std::numeric_limits<double>::infinity());
    return std::vector<Tensor>{r.out, where(finite, r.lse, zeros({}, {.dtype = DType::f64, .device = x[0].device()}))};
  };
}

Tensor gpu_grad_input(const Shape& shape, uint64_t seed) {
  Tensor t = testing::on_gpu(testing::random_cpu(shape, DType::f64, seed));
  t.set_requires_grad(true);
  return t;
}

TEST_F(UnfusedAttention, GradcheckBshdCausalGqaWithDifferentValueDim) {
  const AttentionSpec spec{.qkv_format = QkvFormat::bshd, .mask = MaskType::causal};
  EXPECT_GRADCHECK(attention_fn(spec, std::nullopt),
                   (std::vector<Tensor>{gpu_grad_input({2, 5, 4, 3}, 1), gpu_grad_input({2, 5, 2, 3}, 2),
                                        gpu_grad_input({2, 5, 2, 2}, 3)}));
}

TEST_F(UnfusedAttention, GradcheckThdPaddedWithWindowAndOffsets) {
  const SequenceInfo seq =
      SequenceInfo::from_cu_seqlens({0, 3, 4, 4, 6}, {0, 4, 6, 7, 9}).with_position_offsets({2, 0, 0, 1}, {0, 0, 0, 0});
  const AttentionSpec spec{.qkv_format = QkvFormat::thd, .mask = MaskType::padding_causal, .window = {1, 0}};
  EXPECT_GRADCHECK(
      attention_fn(spec, seq),
      (std::vector<Tensor>{gpu_grad_input({9, 2, 3}, 7), gpu_grad_input({9, 1, 3}, 8), gpu_grad_input({9, 1, 2}, 9)}));
}

}  // namespace
}  // namespace cpf
