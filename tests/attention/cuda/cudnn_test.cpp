// cuDNN's fused attention (attention/cuda/cudnn/fused_attention.h) through the public API with
// AttentionKernelConfig{.backend = cudnn}, against the CPU flash kernels run in f32 on the same bf16-rounded
// inputs. Tolerances are TransformerEngine's for bf16 fused attention, as the largest absolute error
// relative to the largest reference magnitude: 2.5e-2 (MHA), 3.5e-2 (GQA/MQA); lse 1e-5 relative
// (both sides compute it in f32). Exact checks on top: no NaN, -inf lse exactly where the reference
// has it, exact zeros at padding and fully masked rows. Every failure names the case and the tensor.
// Without a GPU every test skips; unsupported_reason's static checks, which need none, are in
// cudnn_unsupported_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "attention/attention_op.h"
#include "attention/attention_problem.h"
#include "attention/cuda/cudnn/fused_attention.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/views.h"
#include "tests/attention/cuda/cudnn_case.h"
#include "tests/tensor/cuda/cuda_test_utils.h"

namespace cpf {
namespace {

using testing::on_cpu;
using testing::on_gpu;
using testing::random_cpu;

using Case = testing::CudnnCase;
using testing::shape_of;
using testing::spec_of;

struct Inputs {
  Tensor q, k, v, dout;  // bf16, CPU
};

Inputs make_inputs(const Case& c, uint64_t seed) {
  return {random_cpu(shape_of(c, c.s_q, c.h_q, c.d_qk), DType::bf16, seed),
          random_cpu(shape_of(c, c.s_kv, c.h_kv, c.d_qk), DType::bf16, seed + 1),
          random_cpu(shape_of(c, c.s_kv, c.h_kv, c.d_v), DType::bf16, seed + 2),
          random_cpu(shape_of(c, c.s_q, c.h_q, c.d_v), DType::bf16, seed + 3)};
}

struct Result {
  Tensor out, lse, dq, dk, dv;  // CPU
};

// The CPU reference: f32 flash kernels on the bf16 values widened to f32.
Result reference(const Case& c, const Inputs& in) {
  const Tensor q = raw::to(in.q, DType::f32), k = raw::to(in.k, DType::f32), v = raw::to(in.v, DType::f32);
  const Tensor dout = raw::to(in.dout, DType::f32);
  const raw::AttentionForward f = raw::attention_forward(q, k, v, spec_of(c), c.seq);
  const raw::AttentionGrads g = raw::attention_backward(dout, Tensor(), q, k, v, f.out, f.lse, spec_of(c), c.seq);
  return {f.out, f.lse, g.dq, g.dk, g.dv};
}

AttentionKernelConfig cudnn_config(const Case& c) {
  return {.backend = AttentionBackend::cudnn, .deterministic = c.deterministic};
}

Result run_cudnn(const Case& c, const Inputs& in) {
  const Tensor q = on_gpu(in.q), k = on_gpu(in.k), v = on_gpu(in.v);
  const raw::AttentionForward f = raw::attention_forward(q, k, v, spec_of(c), c.seq, cudnn_config(c));
  const raw::AttentionGrads g =
      raw::attention_backward(on_gpu(in.dout), Tensor(), q, k, v, f.out, f.lse, spec_of(c), c.seq, cudnn_config(c));
  return {on_cpu(f.out), on_cpu(f.lse), on_cpu(g.dq), on_cpu(g.dk), on_cpu(g.dv)};
}

// Per storage token (row * row_len + col): whether the contract pins its results exactly: queries
// whose reference output row is exactly 0 (padding or no visible key: out 0, lse -inf, dq 0) and keys
// outside every sequence (dk, dv 0). Other exact zeros of the reference (a row that sees one key has
// dS = 0, hence dq = 0 in exact arithmetic) are only held to the tolerance.
std::vector<uint8_t> pinned_queries(const Case& c, const Tensor& ref_out) {
  const auto out = ref_out.to_vector<double>();
  const int64_t row = c.h_q * c.d_v, tokens = static_cast<int64_t>(out.size()) / row;
  std::vector<uint8_t> flags(static_cast<size_t>(tokens), 0);
  for (int64_t e = 0; e < tokens; ++e) {
    // e indexes the tensor's (seq, batch) order for sbhd; flags use the storage order.
    const int64_t token = c.format == QkvFormat::sbhd ? (e % c.batch) * c.s_q + e / c.batch : e;
    const auto first = out.begin() + e * row;
    flags[static_cast<size_t>(token)] = std::all_of(first, first + row, [](double x) { return x == 0; }) ? 1 : 0;
  }
  return flags;
}
std::vector<uint8_t> pinned_keys(const Case& c) {
  const int64_t tokens = c.format == QkvFormat::thd ? c.s_kv : c.batch * c.s_kv;
  std::vector<uint8_t> flags(static_cast<size_t>(tokens), c.seq ? 1 : 0);
  if (c.seq) {
    for (int64_t n = 0; n < c.seq->num_sequences(); ++n) {
      std::fill_n(flags.begin() + c.seq->kv_start(n), c.seq->kv_length(n), uint8_t{0});
    }
  }
  return flags;
}

// The storage token of element e of a q/k/v-shaped tensor (rows of `row` elements) or of the lse.
int64_t token_of(const Case& c, int64_t e, int64_t row, int64_t seq, bool lse) {
  if (lse) {
    if (c.format == QkvFormat::thd) return e % seq;  // (h, t)
    return (e / (c.h_q * seq)) * seq + e % seq;      // (b, h, s)
  }
  const int64_t t = e / row;
  return c.format == QkvFormat::sbhd ? (t % c.batch) * seq + t / c.batch : t;
}

struct Check {
  double tol;
  bool per_element;                    // lse: |got - ref| <= tol * max(1, |ref|) per entry
  const std::vector<uint8_t>* pinned;  // per storage token: must equal the reference exactly
  int64_t row, seq;                    // elements per token; tokens per batch row (thd: all)
  bool lse = false;
};

// max |got - ref| / max |ref| <= tol over the finite entries (or the per-entry lse bound), no NaN,
// infinities equal, and exact equality at pinned tokens.
::testing::AssertionResult matches(const Case& c, const Tensor& got, const Tensor& ref, const Check& k) {
  if (got.shape() != ref.shape()) {
    return ::testing::AssertionFailure() << "shape " << shape_str(got.shape()) << " vs reference "
                                         << shape_str(ref.shape());
  }
  const auto a = got.to_vector<double>(), b = ref.to_vector<double>();
  double max_err = 0, max_ref = 0, worst_rel = 0;
  size_t worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i])) {
      return ::testing::AssertionFailure() << "NaN at element " << i << " (reference " << b[i] << ")";
    }
    const int64_t token = token_of(c, static_cast<int64_t>(i), k.row, k.seq, k.lse);
    const bool pinned = (*k.pinned)[static_cast<size_t>(token)] != 0;
    if (pinned || std::isinf(a[i]) || std::isinf(b[i])) {
      if (a[i] != b[i]) {
        return ::testing::AssertionFailure()
               << "element " << i << " (storage token " << token << ") is " << a[i] << ", reference " << b[i]
               << (pinned ? " (padding or a row that sees no key: must be exact)" : "");
      }
      continue;
    }
    const double err = std::abs(a[i] - b[i]);
    const double rel = err / std::max(1.0, std::abs(b[i]));
    if (k.per_element ? rel > worst_rel : err > max_err) worst = i;
    max_err = std::max(max_err, err);
    worst_rel = std::max(worst_rel, rel);
    max_ref = std::max(max_ref, std::abs(b[i]));
  }
  const double score = k.per_element ? worst_rel : (max_ref == 0 ? max_err : max_err / max_ref);
  if (score > k.tol) {
    return ::testing::AssertionFailure() << (k.per_element ? "relative error " : "max error / max |ref| ") << score
                                         << " > " << k.tol << " (max abs error " << max_err << ", max |ref| " << max_ref
                                         << ", worst element " << worst << ": " << a[worst] << " vs " << b[worst]
                                         << ")";
  }
  return ::testing::AssertionSuccess() << "error " << score;
}

void expect_matches(const Case& c, const Result& got, const Result& want) {
  const double tol = c.h_q == c.h_kv ? 2.5e-2 : 3.5e-2;
  const std::vector<uint8_t> queries = pinned_queries(c, want.out), keys = pinned_keys(c);
  const int64_t sq = c.s_q, skv = c.s_kv;
  EXPECT_TRUE(matches(c, got.out, want.out, {tol, false, &queries, c.h_q * c.d_v, sq})) << c.name << ": out";
  EXPECT_TRUE(matches(c, got.lse, want.lse, {1e-5, true, &queries, 1, sq, true})) << c.name << ": lse";
  EXPECT_TRUE(matches(c, got.dq, want.dq, {tol, false, &queries, c.h_q * c.d_qk, sq})) << c.name << ": dq";
  EXPECT_TRUE(matches(c, got.dk, want.dk, {tol, false, &keys, c.h_kv * c.d_qk, skv})) << c.name << ": dk";
  EXPECT_TRUE(matches(c, got.dv, want.dv, {tol, false, &keys, c.h_kv * c.d_v, skv})) << c.name << ": dv";
}

::testing::AssertionResult bitwise_equal(const Tensor& a, const Tensor& b) {
  const auto x = a.to_vector<double>(), y = b.to_vector<double>();
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    if (!(x[i] == y[i] || (std::isnan(x[i]) && std::isnan(y[i])))) {
      return ::testing::AssertionFailure() << "element " << i << ": " << x[i] << " vs " << y[i];
    }
  }
  return ::testing::AssertionSuccess();
}

std::vector<Case> feature_cases() {
  using F = QkvFormat;
  using M = MaskType;
  std::vector<Case> cs;
  cs.push_back({.name = "bshd_causal_mha_d64", .mask = M::causal, .s_q = 256, .s_kv = 256});
  cs.push_back({.name = "bshd_no_mask_d128_len200", .s_q = 200, .s_kv = 200, .d_qk = 128, .d_v = 128});
  cs.push_back({.name = "bshd_cross_sq128_skv320", .s_q = 128, .s_kv = 320});
  cs.push_back({.name = "sbhd_causal_d128",
                .format = F::sbhd,
                .mask = M::causal,
                .batch = 3,
                .s_q = 192,
                .s_kv = 192,
                .d_qk = 128,
                .d_v = 128});
  cs.push_back(
      {.name = "sbhd_no_mask_gqa", .format = F::sbhd, .batch = 2, .s_q = 160, .s_kv = 160, .h_q = 8, .h_kv = 2});
  cs.push_back({.name = "bshd_sliding_window_causal", .mask = M::causal, .window = {63, -1}, .s_q = 300, .s_kv = 300});
  cs.push_back({.name = "bshd_sliding_window_non_causal", .window = {40, 20}, .s_q = 256, .s_kv = 256});
  cs.push_back({.name = "bshd_gqa_8_2_causal_d128",
                .mask = M::causal,
                .s_q = 256,
                .s_kv = 256,
                .h_q = 8,
                .h_kv = 2,
                .d_qk = 128,
                .d_v = 128});
  cs.push_back({.name = "bshd_mqa_8_1", .s_q = 192, .s_kv = 192, .h_q = 8, .h_kv = 1});
  cs.push_back(
      {.name = "bshd_mla_192_128_causal", .mask = M::causal, .s_q = 256, .s_kv = 256, .d_qk = 192, .d_v = 128});
  cs.push_back({.name = "bshd_mla_192_128_gqa",
                .mask = M::causal,
                .s_q = 128,
                .s_kv = 128,
                .h_q = 8,
                .h_kv = 2,
                .d_qk = 192,
                .d_v = 128});
  cs.push_back({.name = "bshd_d256_causal",
                .mask = M::causal,
                .batch = 1,
                .s_q = 256,
                .s_kv = 256,
                .h_q = 2,
                .h_kv = 2,
                .d_qk = 256,
                .d_v = 256});
  cs.push_back({.name = "bshd_padding_causal",
                .mask = M::padding_causal,
                .s_q = 256,
                .s_kv = 256,
                .seq = SequenceInfo::from_lengths({256, 77}, 256)});
  cs.push_back({.name = "sbhd_padding_causal",
                .format = F::sbhd,
                .mask = M::padding_causal,
                .s_q = 192,
                .s_kv = 192,
                .seq = SequenceInfo::from_lengths({192, 100}, 192)});
  cs.push_back({.name = "bshd_padding_cross",
                .mask = M::padding,
                .s_q = 128,
                .s_kv = 192,
                .seq = SequenceInfo::from_lengths({100, 128}, {192, 33}, 128, 192)});
  // thd: lengths that are not multiples of 64, packed and with padded slots.
  cs.push_back({.name = "thd_causal_1000_700_37",
                .format = F::thd,
                .mask = M::causal,
                .batch = 1,
                .s_q = 1737,
                .s_kv = 1737,
                .seq = SequenceInfo::from_lengths({1000, 700, 37})});
  cs.push_back({.name = "thd_no_mask_padded_slots_gqa",
                .format = F::thd,
                .batch = 1,
                .s_q = 640,
                .s_kv = 640,
                .h_q = 8,
                .h_kv = 2,
                .seq = SequenceInfo::from_cu_seqlens({0, 300, 557, 600}, {0, 320, 577, 640})});
  cs.push_back({.name = "thd_sliding_window_causal",
                .format = F::thd,
                .mask = M::causal,
                .window = {100, -1},
                .batch = 1,
                .s_q = 500,
                .s_kv = 500,
                .seq = SequenceInfo::from_lengths({300, 200})});
  cs.push_back({.name = "thd_mla_causal",
                .format = F::thd,
                .mask = M::causal,
                .batch = 1,
                .s_q = 400,
                .s_kv = 400,
                .d_qk = 192,
                .d_v = 128,
                .seq = SequenceInfo::from_lengths({150, 250})});
  // Position offsets (what CP steps ask for): a shifted diagonal, rows that see no key at all, and
  // per-sequence bottom-right alignment.
  cs.push_back({.name = "bshd_causal_queries_ahead_by_64",
                .mask = M::causal,
                .s_q = 128,
                .s_kv = 256,
                .seq = SequenceInfo::from_lengths({128, 128}, {256, 256}, 128, 256).with_position_offsets(64, 0)});
  cs.push_back({.name = "bshd_window_both_sides_shifted",
                .window = {32, 16},
                .s_q = 128,
                .s_kv = 256,
                .seq = SequenceInfo::from_lengths({128, 128}, {256, 256}, 128, 256).with_position_offsets(50, 0)});
  cs.push_back({.name = "bshd_causal_fully_masked_rows",
                .mask = M::causal,
                .s_q = 128,
                .s_kv = 128,
                .seq = SequenceInfo::from_lengths({128, 128}, 128).with_position_offsets(0, 64)});
  cs.push_back({.name = "thd_causal_bottom_right",
                .format = F::thd,
                .mask = M::causal,
                .batch = 1,
                .s_q = 400,
                .s_kv = 700,
                .seq = SequenceInfo::from_lengths({100, 300}, {300, 400}).with_position_offsets({200, 100}, {0, 0})});
  cs.push_back({.name = "thd_window_fully_masked_rows",
                .format = F::thd,
                .mask = M::causal,
                .window = {16, -1},
                .batch = 1,
                .s_q = 300,
                .s_kv = 300,
                .seq = SequenceInfo::from_lengths({150, 150}).with_position_offsets(0, 40)});
  return cs;
}

class CudnnAttention : public testing::CudaTest {};

TEST_F(CudnnAttention, MatchesCpuReferenceOnEveryFeature) {
  std::ostringstream summary;
  uint64_t seed = 100;
  for (const Case& c : feature_cases()) {
    SCOPED_TRACE(c.name);
    const Inputs in = make_inputs(c, seed += 10);
    Result got;
    try {
      got = run_cudnn(c, in);
    } catch (const Error& e) {
      ADD_FAILURE() << c.name << ": cuDNN call failed: " << e.what();
      continue;
    }
    expect_matches(c, got, reference(c, in));
  }
}

TEST_F(CudnnAttention, DeterministicBackwardIsBitwiseReproducible) {
  const Case c{.name = "deterministic_gqa",
               .mask = MaskType::causal,
               .s_q = 512,
               .s_kv = 512,
               .h_q = 8,
               .h_kv = 2,
               .d_qk = 128,
               .d_v = 128,
               .deterministic = true};
  const Inputs in = make_inputs(c, 7);
  const Result first = run_cudnn(c, in), second = run_cudnn(c, in);
  EXPECT_TRUE(bitwise_equal(first.dq, second.dq)) << "dq";
  EXPECT_TRUE(bitwise_equal(first.dk, second.dk)) << "dk";
  EXPECT_TRUE(bitwise_equal(first.dv, second.dv)) << "dv";
  expect_matches(c, first, reference(c, in));
}

// The non-deterministic backward accumulates dQ in an fp32 buffer from the caching allocator, which
// cuDNN >= 9.6 zeroes itself (cpformer no longer does): calls that reuse the same blocks (same sizes,
// interleaved with another shape, and blocks poisoned with 1e30 before each round) must each be correct.
TEST_F(CudnnAttention, RepeatedBackwardCallsReusingBuffersStayCorrect) {
  const Case a{.name = "repeat_a", .mask = MaskType::causal, .s_q = 256, .s_kv = 256, .h_q = 8, .h_kv = 2};
  const Case b{.name = "repeat_b", .s_q = 128, .s_kv = 128};
  const Inputs in_a = make_inputs(a, 21), in_b = make_inputs(b, 31);
  const Result want_a = reference(a, in_a), want_b = reference(b, in_b);
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    for (const Case* c : {&a, &b}) {  // blocks of the accumulators' sizes, dirty when freed
      (void)full({c->batch, c->h_q, c->s_q, c->d_qk}, 1e30, {.dtype = DType::f32, .device = Device::cuda(0)});
    }
    expect_matches(a, run_cudnn(a, in_a), want_a);
    expect_matches(b, run_cudnn(b, in_b), want_b);
  }
}

// q, k, v as strided views of one fused (b, s, 3, h, d) projection on the GPU: cuDNN reads them through
// their strides and writes dq, dk, dv into one buffer of that layout (attention/cuda/cudnn/strided_layout.h).
TEST_F(CudnnAttention, StridedViewsOfAFusedProjection) {
  const Case c{.name = "fused_qkv_views", .mask = MaskType::causal, .s_q = 128, .s_kv = 128};
  const Tensor fused = random_cpu({c.batch, c.s_q, 3, c.h_q, c.d_qk}, DType::bf16, 77);
  const Inputs in{raw::contiguous(raw::select(fused, 2, 0)), raw::contiguous(raw::select(fused, 2, 1)),
                  raw::contiguous(raw::select(fused, 2, 2)),
                  random_cpu(shape_of(c, c.s_q, c.h_q, c.d_v), DType::bf16, 78)};
  const Tensor gpu = on_gpu(fused);
  const Tensor q = raw::select(gpu, 2, 0), k = raw::select(gpu, 2, 1), v = raw::select(gpu, 2, 2);
  ASSERT_FALSE(q.is_contiguous());
  const raw::AttentionForward f = raw::attention_forward(q, k, v, spec_of(c), c.seq, cudnn_config(c));
  const raw::AttentionGrads g =
      raw::attention_backward(on_gpu(in.dout), Tensor(), q, k, v, f.out, f.lse, spec_of(c), c.seq, cudnn_config(c));
  expect_matches(c, {on_cpu(f.out), on_cpu(f.lse), on_cpu(g.dq), on_cpu(g.dk), on_cpu(g.dv)}, reference(c, in));
}

// Rank threads share a GPU, each on its own stream: handles and plans are per thread and follow the
// thread's current stream, so concurrent calls stay correct.
TEST_F(CudnnAttention, ThreadsWithTheirOwnStreamsGetCorrectResults) {
  const std::vector<Case> cs{
      {.name = "thread_causal_gqa", .mask = MaskType::causal, .s_q = 256, .s_kv = 256, .h_q = 8, .h_kv = 2},
      {.name = "thread_thd",
       .format = QkvFormat::thd,
       .mask = MaskType::causal,
       .batch = 1,
       .s_q = 300,
       .s_kv = 300,
       .seq = SequenceInfo::from_lengths({200, 100})}};
  std::vector<Inputs> inputs;
  for (size_t i = 0; i < cs.size(); ++i) inputs.push_back(make_inputs(cs[i], 300 + 10 * i));
  std::vector<Result> got(cs.size());
  std::vector<std::string> errors(cs.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < cs.size(); ++i) {
    threads.emplace_back([&, i] {
      try {
        const cuda::Stream stream = cuda::Stream::create(0);
        cuda::StreamGuard guard(stream);
        for (int round = 0; round < 3; ++round) got[i] = run_cudnn(cs[i], inputs[i]);
        stream.synchronize();
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < cs.size(); ++i) {
    ASSERT_EQ(errors[i], "") << cs[i].name;
    expect_matches(cs[i], got[i], reference(cs[i], inputs[i]));
  }
}

// cuDNN 9.19's Hopper backward reads an unmasked out-of-bounds tile when s_kv % 128 == 64 and
// overflows exp(0 - lse) to NaN for rows with lse < -88.7 (docs/attention.md, "GPU attention: cuDNN").
// The mapping always passes seq_len with the padding mask at such lengths; this input
// would give NaN dQ without that guard: keys uniform in [-5, -1], some query rows all 6, so those rows
// score about -3 * 6 * 64 / 8 = -144 everywhere. (Keys spread over a wide range rather than a constant
// plus noise: dq depends on the keys minus their mean, and bf16 dS against a large common offset would
// lose that difference to rounding on any implementation.)
TEST_F(CudnnAttention, VeryNegativeLseAtSkvSixtyFourModulo128HasNoNan) {
  for (const MaskType mask : {MaskType::no_mask, MaskType::causal}) {
    Case c{.name = std::string("negative_lse_s192_") + std::string(mask_type_name(mask)),
           .mask = mask,
           .s_q = 192,
           .s_kv = 192};
    Inputs in = make_inputs(c, 55);
    auto k = raw::to(in.k, DType::f32).to_vector<float>();
    for (float& x : k) x = -3.0f + 2.0f * x;
    in.k = raw::to(from_vector(k, in.k.shape()), DType::bf16);
    auto q = raw::to(in.q, DType::f32).to_vector<float>();
    const int64_t row = c.h_q * c.d_qk;
    for (int64_t t : {5, 64, 100, 191}) {  // batch 0 tokens t, every head
      for (int64_t i = 0; i < row; ++i) q[static_cast<size_t>(t * row + i)] = 6.0f;
    }
    in.q = raw::to(from_vector(q, in.q.shape()), DType::bf16);
    const Result want = reference(c, in);
    ASSERT_LT(want.lse.to_vector<float>()[5], -88.7f) << "the adversarial rows must have lse < -88.7";
    expect_matches(c, run_cudnn(c, in), want);
  }
}

TEST_F(CudnnAttention, ForcedCudnnRejectsF32WithTheReason) {
  const Tensor q = on_gpu(random_cpu({1, 64, 2, 64}, DType::f32, 1));
  EXPECT_CPF_ERROR(raw::attention_forward(q, q, q, {}, std::nullopt, {.backend = AttentionBackend::cudnn}),
                   "f32 inputs");
}
}  // namespace
}  // namespace cpf
