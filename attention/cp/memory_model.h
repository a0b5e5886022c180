#pragma once
// What one rank holds during a CP attention call, by formula (docs/cp.md, "Memory per rank"), so the
// benchmarks can print the expected figure next to the measured peak and a regression in either shows.
//
// The call is a training step's attention: the caller holds q, k, v and dO (this rank's T tokens), the
// autograd keeps out and lse for the backward, and the backward returns dq, dk, dv (the "caller" term,
// the same for every strategy and a rank's share of the one-device figure). On top of that each
// strategy holds its own tensors: blocks received, merge accumulators, tile results, saved head-split
// state, the kernel's workspace. The estimate lists them by name at the forward's and the backward's
// peak; the peak of the call is the caller's tensors plus the larger of the two.
//
// Element sizes: e = bytes of the inputs' dtype (2 for bf16), a = accumulation bytes (4; 8 for f64);
// lse and the kernel's fp32 workspace as they are (f32, f64 for f64 inputs). Per token: Q = Hq Dqk,
// K = Hkv Dqk, V = Hkv Dv, O = Hq Dv, L = Hq values. The K/V path only (not the MLA latent).
#include <cstdint>
#include <string>
#include <vector>

#include "attention/cp/context_parallel.h"

namespace cpf::cp {

struct CpMemoryShape {
  int64_t tokens_per_rank = 0;  // T: the global sequence / P
  int64_t cp = 1;               // P
  int64_t a2a = 1;              // a2a+p2p: the a2a sub-group size A (A x R = P)
  int64_t heads = 0, kv_heads = 0, head_dim_qk = 0, head_dim_v = 0;
  DType dtype = DType::bf16;
  // Where the call runs: a device with an in-place ring accumulation kernel (lse_merge.h,
  // register_device_accumulate: the CUDA backend's) reads a bf16 tile's dQ as it is; elsewhere the tile's
  // dQ is widened to fp32 first, a copy the p2p backward then holds.
  DeviceType device = DeviceType::cpu;
};

struct CpMemoryTerm {
  std::string name;
  int64_t bytes = 0;
};

struct CpMemoryEstimate {
  int64_t caller = 0;                  // q, k, v, dO, out, lse, dq, dk, dv of this rank's tokens
  std::vector<CpMemoryTerm> forward;   // the strategy's own tensors at its forward peak
  std::vector<CpMemoryTerm> backward;  // ... at its backward peak (what the forward saved included)

  int64_t forward_bytes() const;
  int64_t backward_bytes() const;
  int64_t peak_bytes() const;  // caller + max(forward, backward)
  // "caller 2.00 GiB + backward 1.75 GiB (dQ accumulator (fp32) 0.50, ...)", for tables and messages.
  std::string describe() const;
};

// The estimate for `comm` at `shape`. Refuses shapes the strategy refuses (P < 2, a2a heads not divisible,
// a2a+p2p with A not dividing P), naming the values.
CpMemoryEstimate cp_memory_estimate(CommType comm, const CpMemoryShape& shape);

// The same training call on one device over the whole sequence (P T tokens): the caller's tensors and
// the attention kernel's backward workspace. The CP target is peak_bytes / this <= 0.6 at 64k tokens
// per rank (docs/cp.md).
CpMemoryEstimate single_device_memory_estimate(const CpMemoryShape& shape);

}  // namespace cpf::cp
