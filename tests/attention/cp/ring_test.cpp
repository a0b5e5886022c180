// The p2p ring's own behaviour beyond equivalence: dK/dV travel in the inputs' dtype (bf16: half the
// bytes, with the accuracy the rounding per hop allows), its phases show as profile scopes, and the
// running (out, lse) merge updates its accumulators in place with the formula of lse_merge.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "attention/cp/lse_merge.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/reduce.h"
#include "framework/tensor/ops/views.h"
#include "framework/tensor/profile.h"
#include "tests/attention/cp/cp_grid.h"

namespace cpf::cp::testing {
namespace {

const AttentionWindow kCausal{-1, 0};

CpCase bf16_ring(int cp) {
  CpCase c = grid_case(CommType::p2p, cp, QkvFormat::bshd, MaskType::causal, kCausal, {"", 4, 2, 8, 8});
  c.d_v = 4;  // d_qk != d_v: K and V travel as two messages of their own widths
  c.dtype = DType::bf16;
  return c;
}

TEST(CpRing, GradientsTravelInTheInputDtype) {
  const CpCase c = bf16_ring(4);
  std::vector<CpStats> stats;
  run_cp(c, make_global(c), &stats);
  const int64_t t = c.batch * c.seq / c.cp;
  const int64_t kv = t * c.kv_heads * (c.d_qk + c.d_v) * 2;  // bf16
  for (int r = 0; r < c.cp; ++r) {
    EXPECT_EQ(stats[r].forward_bytes_sent, (c.cp - 1) * kv) << "rank " << r;
    // KV around the ring again, and the dK/dV sums P hops one step behind, in bf16.
    EXPECT_EQ(stats[r].backward_bytes_sent, (c.cp - 1) * kv + c.cp * kv) << "rank " << r;
  }
}

// max |t| over the elements, in double.
double max_abs(const Tensor& t) {
  return raw::amax(raw::unary(raw::UnaryOp::abs, raw::to(t, DType::f64)), {}).item<double>();
}

TEST(CpRing, Bf16GradientSumsStayWithinTheRoundingOfEachHop) {
  const CpCase c = bf16_ring(4);
  const Global g = make_global(c);
  // The exact answer: the same bf16 inputs, computed in f32 on one rank.
  CpCase c32 = c;
  c32.dtype = DType::f32;
  Global g32 = g;
  for (Tensor* t : {&g32.q, &g32.k, &g32.v, &g32.dout}) *t = raw::to(*t, DType::f32);
  const Tensors exact = reference(c32, g32);
  const auto got = run_cp(c, g);
  // Each rank's tile dK/dV is rounded to bf16 once (the kernel's output) and each of the P hops rounds
  // the running sum once: at most 2P + 1 roundings of 2^-9 relative, on partial sums bounded by twice
  // the largest gradient (tiles of one causal row can partly cancel).
  for (const auto& [name, exact_full, pick] :
       {std::tuple{"dk", exact.dk, &Tensors::dk}, std::tuple{"dv", exact.dv, &Tensors::dv}}) {
    const double bound = (2 * c.cp + 1) * std::ldexp(1.0, -9) * 2 * max_abs(exact_full);
    for (int r = 0; r < c.cp; ++r) {
      const Tensor want = shard(c, g, exact_full, g.seq_dim, r);
      EXPECT_TRUE(::cpf::testing::all_close(raw::to(got[r].*pick, DType::f32), want, bound, 0))
          << name << " rank " << r << " bound " << bound;
    }
  }
}

// Ranks whose tokens are all padding compute no tile; their dq starts nowhere and must come back 0
// (the accumulator is otherwise started from the first computed tile's dq).
TEST(CpRing, RanksWithoutRealTokensReturnZeroGradients) {
  CpCase c = grid_case(CommType::p2p, 4, QkvFormat::thd, MaskType::causal, kCausal, {"", 4, 2, 8, 8});
  c.mask = MaskType::padding_causal;
  c.thd_lengths = {1, 2};  // slots of 8 tokens: only ranks 0 and 1 hold real tokens
  const Global g = make_global(c);
  const Tensors ref = reference(c, g);
  std::vector<CpStats> stats;
  const auto got = run_cp(c, g, &stats);
  for (int r = 0; r < c.cp; ++r) {
    for (const auto& [name, want, have] : {std::tuple{"dq", ref.dq, got[r].dq}, std::tuple{"dk", ref.dk, got[r].dk},
                                           std::tuple{"dv", ref.dv, got[r].dv}}) {
      EXPECT_TRUE(::cpf::testing::all_close(have, shard(c, g, want, g.seq_dim, r), 1e-6, 1e-5))
          << name << " rank " << r;
    }
  }
  EXPECT_EQ(stats[3].backward_tiles.computed(), 0) << "rank 3 holds padding only";
}

bool has_scope(const std::vector<profile::Stats>& table, const std::string& name) {
  return std::any_of(table.begin(), table.end(),
                     [&](const profile::Stats& s) { return s.name == name && s.calls > 0; });
}

TEST(CpRing, PhasesAppearInTheProfileTable) {
  profile::reset();
  profile::set_enabled(true);
  const CpCase c = grid_case(CommType::p2p, 2, QkvFormat::bshd, MaskType::causal, kCausal, {"", 4, 4, 8, 8});
  run_cp(c, make_global(c));
  const auto table = profile::snapshot();
  profile::set_enabled(false);
  profile::reset();
  for (const char* name : {"cp/p2p/pack", "cp/p2p/wait", "cp/p2p/tile", "cp/p2p/merge", "cp/p2p/backward/pack",
                           "cp/p2p/backward/wait", "cp/p2p/backward/tile"}) {
    EXPECT_TRUE(has_scope(table, name)) << name;
  }
}

TEST(CpRing, MergeUpdatesTheRunningPairInPlace) {
  const double inf = std::numeric_limits<double>::infinity();
  // 2 tokens, 1 head, d = 2. Part a sees keys for both rows; part b only for row 1 (row 0 has lse -inf and
  // an output that must not matter).
  const Tensor out_a = from_vector<float>({1, 2, 3, 4}, {2, 1, 2});
  const Tensor lse_a = from_vector<float>({0.5f, -1.0f}, {1, 2});
  const Tensor out_b = from_vector<float>({100, 100, -2, 6}, {2, 1, 2});
  const Tensor lse_b = from_vector<float>({static_cast<float>(-inf), 1.0f}, {1, 2});
  PartialMerge merge(2, 1, 2, DType::f32);
  const void* lse_storage = merge.lse().raw_data();
  merge.add(out_a, lse_a);
  merge.add(out_b, lse_b);
  EXPECT_EQ(merge.lse().raw_data(), lse_storage) << "the running lse was reallocated";
  // Row 0: part a alone. Row 1: L = log(e^-1 + e^1), O = w_a O_a + w_b O_b with w_i = e^(L_i - L).
  const double l1 = std::log(std::exp(-1.0) + std::exp(1.0));
  const double wa = std::exp(-1.0 - l1), wb = std::exp(1.0 - l1);
  const auto lse = merge.lse().to_vector<double>();
  const auto out = merge.out(DType::f32).to_vector<double>();
  EXPECT_NEAR(lse[0], 0.5, 1e-6);
  EXPECT_NEAR(lse[1], l1, 1e-6);
  EXPECT_NEAR(out[0], 1, 1e-6);
  EXPECT_NEAR(out[1], 2, 1e-6);
  EXPECT_NEAR(out[2], wa * 3 + wb * -2, 1e-6);
  EXPECT_NEAR(out[3], wa * 4 + wb * 6, 1e-6);
}

TEST(CpRing, MergeRefusesPartsOfAnotherShape) {
  PartialMerge merge(2, 1, 2, DType::f32);
  EXPECT_CPF_ERROR(merge.add(zeros({2, 1, 3}), zeros({1, 2})),
                   "cp merge: partial out [2,1,3] / lse [1,2] do not match the accumulator [2,1,2]");
  EXPECT_CPF_ERROR(merge.add(zeros({2, 1, 2}, {.dtype = DType::i32}), zeros({1, 2})),
                   "cp merge: partial out (i32) and lse (f32) must be floating");
}

TEST(CpRing, DeviceMergeKernelsAreForDevicesOnly) {
  EXPECT_CPF_ERROR(register_device_merge(DeviceType::cpu, nullptr), "the CPU merges in its host loop");
  EXPECT_EQ(device_merge(DeviceType::cpu), nullptr);
}

TEST(CpRing, AccumulateAddsAPartOfAnyFloatDtypeInPlace) {
  const Tensor acc = from_vector<float>({1, 2, 3, 4}, {2, 2});
  const void* storage = acc.raw_data();
  accumulate(acc, raw::to(from_vector<float>({0.5f, -2, 8, 0.25f}, {2, 2}), DType::bf16));
  accumulate(acc, from_vector<double>({1, 1, 1, 1}, {2, 2}));
  EXPECT_EQ(acc.raw_data(), storage);
  EXPECT_EQ(acc.to_vector<float>(), (std::vector<float>{2.5f, 1, 12, 5.25f}));
}

TEST(CpRing, AccumulateRefusesWhatItCannotAdd) {
  const Tensor acc = zeros({2, 2});
  EXPECT_CPF_ERROR(accumulate(raw::to(acc, DType::bf16), acc),
                   "cp accumulate: the accumulator must be f32 or f64, got bf16");
  EXPECT_CPF_ERROR(accumulate(acc, zeros({2, 2}, {.dtype = DType::i32})),
                   "cp accumulate: the part must be floating, got i32");
  EXPECT_CPF_ERROR(accumulate(acc, zeros({2, 3})), "cp accumulate: part [2,3] does not match the accumulator [2,2]");
  EXPECT_CPF_ERROR(accumulate(raw::transpose(zeros({2, 3}), 0, 1), zeros({3, 2})),
                   "cp accumulate: the accumulator must be contiguous");
  EXPECT_CPF_ERROR(accumulate(acc, Tensor()), "cp accumulate: undefined part");
  EXPECT_CPF_ERROR(register_device_accumulate(DeviceType::cpu, nullptr), "the CPU accumulates with raw ops");
  EXPECT_EQ(device_accumulate(DeviceType::cpu), nullptr);
}

}  // namespace
}  // namespace cpf::cp::testing
