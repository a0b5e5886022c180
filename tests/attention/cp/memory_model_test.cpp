// The per-rank memory formulas (attention/cp/memory_model.h) against values worked out by hand from
// the terms docs/cp.md lists, and the property the ring is built for: at a fixed global sequence a
// rank's memory falls as cp grows.
#include <gtest/gtest.h>

#include "attention/cp/lse_merge.h"
#include "attention/cp/memory_model.h"
#include "support/test_utils.h"

namespace cpf::cp {
namespace {

// T = 1024 tokens per rank, 2 heads (2 KV heads) of d = 8, bf16: per token Q = K = V = O = 16 values,
// L = 2; e = 2 bytes, a = 4 bytes.
CpMemoryShape small(int64_t cp, DType dtype = DType::bf16) {
  return {.tokens_per_rank = 1024,
          .cp = cp,
          .a2a = 2,
          .heads = 2,
          .kv_heads = 2,
          .head_dim_qk = 8,
          .head_dim_v = 8,
          .dtype = dtype};
}

TEST(CpMemoryModel, CallerTensorsAreTheSameForEveryStrategy) {
  // q, k, v (3 x 16 x 2) + dO (32) + out (32) + lse (2 x 4) + dq, dk, dv (96) = 264 bytes per token.
  EXPECT_EQ(cp_memory_estimate(CommType::p2p, small(4)).caller, 1024 * 264);
  // 4 heads (4 KV heads), which a2a over 4 ranks can split: q, k, v (3 x 32 x 2) + dO (64) + out (64) +
  // lse (4 x 4) + dq, dk, dv (192) = 528 bytes per token.
  CpMemoryShape s = small(4);
  s.heads = s.kv_heads = 4;
  for (CommType comm : {CommType::p2p, CommType::all_gather, CommType::a2a, CommType::a2a_p2p}) {
    EXPECT_EQ(cp_memory_estimate(comm, s).caller, 1024 * 528) << comm_type_name(comm);
  }
}

TEST(CpMemoryModel, RingTermsMatchHandComputedBytes) {
  const CpMemoryEstimate m = cp_memory_estimate(CommType::p2p, small(4));
  // Forward: 2 received blocks (2 x 1024 x 2 x 32) + fp32 out and lse (1024 x 4 x 18) + 2 tile results
  // (2 x 1024 x (2 x 16 + 4 x 2)).
  EXPECT_EQ(m.forward_bytes(), 131072 + 73728 + 81920);
  // Backward: fp32 dQ (65536) + 2 blocks (131072) + tile grads (98304) + tile dQ in fp32 (65536) + the
  // kernel's workspace (1024 x 4 x 18 = 73728) + 2 partial sums (131072).
  EXPECT_EQ(m.backward_bytes(), 65536 + 131072 + 98304 + 65536 + 73728 + 131072);
  EXPECT_EQ(m.peak_bytes(), 1024 * 264 + 565248);
  // Two ranks: the only received block is the one arriving at step 0.
  EXPECT_EQ(cp_memory_estimate(CommType::p2p, small(2)).forward_bytes(), 65536 + 73728 + 81920);
}

// A device whose accumulation kernel reads the bf16 tile in place holds no fp32 copy of it: the model asks
// the same registry the ring uses (lse_merge.h). Registered here for the test's own device type.
void add_in_place(const Tensor&, const Tensor&) {}

TEST(CpMemoryModel, ADeviceAccumulatingInPlaceHoldsNoFp32TileDq) {
  CpMemoryShape s = small(4);
  s.device = DeviceType::cuda;
  const bool cuda_kernel = device_accumulate(DeviceType::cuda) != nullptr;
  const CpMemoryEstimate without = cp_memory_estimate(CommType::p2p, s);
  bool widened = false;
  for (const auto& term : without.backward) widened |= term.name.find("tile dQ in fp32") != std::string::npos;
  EXPECT_EQ(widened, !cuda_kernel) << "the term follows the registry";
  if (!cuda_kernel) register_device_accumulate(DeviceType::cuda, add_in_place);
  const CpMemoryEstimate with = cp_memory_estimate(CommType::p2p, s);
  for (const auto& term : with.backward) EXPECT_EQ(term.name.find("tile dQ in fp32"), std::string::npos) << term.name;
  EXPECT_EQ(with.backward_bytes(), 65536 + 131072 + 98304 + 73728 + 131072);  // the CPU's less the 65536 copy
  if (!cuda_kernel) register_device_accumulate(DeviceType::cuda, nullptr);
}

TEST(CpMemoryModel, F32InputsNeedNoFp32CopyOfTheTileDq) {
  const CpMemoryEstimate m = cp_memory_estimate(CommType::p2p, small(4, DType::f32));
  for (const auto& term : m.backward) EXPECT_EQ(term.name.find("tile dQ in fp32"), std::string::npos) << term.name;
  // e = a = 4: 2 blocks (2 x 1024 x 4 x 32) + fp32 out, lse + 2 tile results (2 x 1024 x (4 x 16 + 4 x 2)).
  EXPECT_EQ(m.forward_bytes(), 262144 + 73728 + 147456);
}

TEST(CpMemoryModel, UlyssesReplicatesKvHeadsUpToTheGroup) {
  CpMemoryShape mqa = small(4);
  mqa.heads = 4;
  mqa.kv_heads = 1;  // replicated to 4 for the exchange: 4 x 8 values of K and of V per token
  const CpMemoryEstimate m = cp_memory_estimate(CommType::a2a, mqa);
  // q (32) + k (32) + v (32) values of 2 bytes per token, twice (kept + exchange buffers), + out (32 x 2)
  // and lse (4 x 4).
  EXPECT_EQ(m.forward_bytes(), 1024 * (2 * 192 + 64 + 16));
}

TEST(CpMemoryModel, RingMemoryPerRankFallsWithCp) {
  // One 128k-token sequence, 16 heads of d = 128 (the GPU benchmark's shape).
  int64_t previous = 0;
  for (int64_t cp : {2, 4, 8}) {
    CpMemoryShape s{
        .tokens_per_rank = 131072 / cp, .cp = cp, .heads = 16, .kv_heads = 16, .head_dim_qk = 128, .head_dim_v = 128};
    const int64_t peak = cp_memory_estimate(CommType::p2p, s).peak_bytes();
    if (previous > 0) EXPECT_LT(peak, previous) << "cp " << cp;
    previous = peak;
    // From 4 ranks on a rank holds less than one device running the whole sequence (at 2 it does not:
    // docs/cp.md, "Memory per rank").
    if (cp >= 4) EXPECT_LT(peak, single_device_memory_estimate(s).peak_bytes()) << "cp " << cp;
  }
}

TEST(CpMemoryModel, SingleDeviceIsTheCallerTensorsOfTheWholeSequenceAndTheKernelWorkspace) {
  const CpMemoryEstimate one = single_device_memory_estimate(small(4));
  EXPECT_EQ(one.caller, 4 * 1024 * 264);
  EXPECT_EQ(one.peak_bytes(), 4 * 1024 * 264 + 4 * 1024 * 4 * 18);
  EXPECT_NE(one.describe().find("kernel workspace"), std::string::npos) << one.describe();
}

TEST(CpMemoryModel, RefusesShapesTheStrategiesRefuse) {
  EXPECT_CPF_ERROR(cp_memory_estimate(CommType::p2p, small(1)), "cp must be at least 2, got 1");
  CpMemoryShape odd = small(4);
  odd.heads = 6;
  EXPECT_CPF_ERROR(cp_memory_estimate(CommType::a2a, odd), "heads 6 are not divisible by cp 4");
  CpMemoryShape three = small(6);
  three.a2a = 4;
  EXPECT_CPF_ERROR(cp_memory_estimate(CommType::a2a_p2p, three), "cp=6 a2a=4 heads=2");
  CpMemoryShape empty = small(4);
  empty.tokens_per_rank = 0;
  EXPECT_CPF_ERROR(cp_memory_estimate(CommType::all_gather, empty), "must be positive: T=0");
  EXPECT_CPF_ERROR(single_device_memory_estimate(empty), "must be positive: T=0 cp=4");
  CpMemoryShape ints = small(4);
  ints.dtype = DType::i32;
  EXPECT_CPF_ERROR(cp_memory_estimate(CommType::p2p, ints), "dtype must be floating");
}

}  // namespace
}  // namespace cpf::cp
