// The per-rank memory formulas of memory_model.h, one function per strategy. Each term names a tensor
// (or group of tensors) the strategy's code holds at that pass's peak; docs/cp.md lists the same terms.
#include "attention/cp/memory_model.h"

#include <algorithm>
#include <cstdio>

#include "attention/cp/lse_merge.h"
#include "framework/core/error.h"

namespace cpf::cp {
namespace {

// Per-token sizes in bytes of one shape (memory_model.h's e, a, Q, K, V, O, L).
struct Sizes {
  int64_t t = 0;  // tokens per rank
  int64_t e = 0, a = 0;
  bool widens_tile_dq = false;                // the ring's accumulation copies a tile's dQ to fp32 (no device kernel)
  int64_t q = 0, k = 0, v = 0, o = 0, l = 0;  // values per token

  int64_t kv_bytes() const { return t * e * (k + v); }  // one K/V block of T tokens
  int64_t lse_bytes() const { return t * a * l; }
  int64_t tile_out_bytes() const { return t * (e * o + a * l); }  // one tile's out and lse
  // The attention kernel's backward workspace over T query rows: the fp32 dQ accumulator and row sums.
  int64_t kernel_workspace() const { return t * a * (q + l); }
};

Sizes sizes_of(const CpMemoryShape& s, int64_t tokens, int64_t kv_heads) {
  Sizes z;
  z.t = tokens;
  z.e = static_cast<int64_t>(dtype_size(s.dtype));
  z.a = s.dtype == DType::f64 ? 8 : 4;
  z.widens_tile_dq = z.e != z.a && device_accumulate(s.device) == nullptr;
  z.q = s.heads * s.head_dim_qk;
  z.k = kv_heads * s.head_dim_qk;
  z.v = kv_heads * s.head_dim_v;
  z.o = s.heads * s.head_dim_v;
  z.l = s.heads;
  return z;
}

int64_t caller_bytes(const Sizes& z) {
  // q, k, v and dO; out and lse kept for the backward; dq, dk, dv returned.
  return z.t * z.e * (z.q + z.k + z.v) + z.t * z.e * z.o + z.t * z.e * z.o + z.lse_bytes() +
         z.t * z.e * (z.q + z.k + z.v);
}

// The ring over `ring` members on blocks of z.t tokens (p2p, and the ring stage of a2a+p2p).
void ring_terms(const Sizes& z, int64_t ring, CpMemoryEstimate& m) {
  // The block in use (received at the previous step) and the one arriving; step 0 uses the caller's.
  const int64_t blocks = std::min<int64_t>(ring - 1, 2) * z.kv_bytes();
  m.forward.push_back({"received K/V blocks (in use, arriving)", blocks});
  m.forward.push_back({"running out and lse (fp32)", z.t * z.a * (z.o + z.l)});
  m.forward.push_back({"tile results in flight (2: merged one tile late)", 2 * z.tile_out_bytes()});
  m.backward.push_back({"dQ accumulator (fp32)", z.t * z.a * z.q});
  m.backward.push_back({"received K/V blocks (in use, arriving)", blocks});
  m.backward.push_back({"tile dQ, dK, dV", z.t * z.e * (z.q + z.k + z.v)});
  if (z.widens_tile_dq) m.backward.push_back({"tile dQ in fp32 before the add", z.t * z.a * z.q});
  m.backward.push_back({"kernel workspace (fp32 dQ, row sums)", z.kernel_workspace()});
  m.backward.push_back({"dK/dV partial sums (sending, arriving)", 2 * z.kv_bytes()});
}

// Ulysses over `group` members: the head-split tensors hold group x T tokens of H / group heads, the
// same bytes as T tokens of H heads (KV heads replicated up to the group size when fewer).
void ulysses_terms(const Sizes& heads, CpMemoryEstimate& m) {
  const int64_t qkv = heads.t * heads.e * (heads.q + heads.k + heads.v);
  const int64_t saved = qkv + heads.tile_out_bytes();
  m.forward.push_back({"head-split q, k, v (kept for the backward)", qkv});
  m.forward.push_back({"exchange buffers (contiguous send, receive before reordering)", qkv});
  m.forward.push_back({"head-split out and lse (kept for the backward)", heads.tile_out_bytes()});
  m.backward.push_back({"saved head-split q, k, v, out, lse", saved});
  m.backward.push_back({"head-split dO (and its exchange buffer)", 2 * heads.t * heads.e * heads.o});
  m.backward.push_back({"exchange buffers of dq, dk, dv", qkv});
}

void check_shape(CommType comm, const CpMemoryShape& s) {
  const std::string who = "cp memory estimate (" + comm_type_name(comm) + ")";
  CPF_CHECK(s.cp >= 2, who, ": cp must be at least 2, got ", s.cp);
  CPF_CHECK(s.tokens_per_rank > 0 && s.heads > 0 && s.kv_heads > 0 && s.head_dim_qk > 0 && s.head_dim_v > 0, who,
            ": tokens_per_rank, heads, kv_heads and head dims must be positive: T=", s.tokens_per_rank, " H=", s.heads,
            " Hkv=", s.kv_heads, " Dqk=", s.head_dim_qk, " Dv=", s.head_dim_v);
  CPF_CHECK(is_floating(s.dtype), who, ": dtype must be floating, got ", s.dtype);
  if (comm == CommType::a2a) {
    CPF_CHECK(s.heads % s.cp == 0, who, ": heads ", s.heads, " are not divisible by cp ", s.cp);
  }
  if (comm == CommType::a2a_p2p) {
    CPF_CHECK(s.a2a >= 2 && s.cp % s.a2a == 0 && s.cp / s.a2a >= 2 && s.heads % s.a2a == 0, who,
              ": needs an a2a size >= 2 dividing cp into a ring of >= 2 and dividing the heads: cp=", s.cp,
              " a2a=", s.a2a, " heads=", s.heads);
  }
}

}  // namespace

int64_t CpMemoryEstimate::forward_bytes() const {
  int64_t sum = 0;
  for (const auto& t : forward) sum += t.bytes;
  return sum;
}

int64_t CpMemoryEstimate::backward_bytes() const {
  int64_t sum = 0;
  for (const auto& t : backward) sum += t.bytes;
  return sum;
}

int64_t CpMemoryEstimate::peak_bytes() const { return caller + std::max(forward_bytes(), backward_bytes()); }

std::string CpMemoryEstimate::describe() const {
  auto gib = [](int64_t bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f", static_cast<double>(bytes) / (1 << 30));
    return std::string(buf);
  };
  const bool bwd = backward_bytes() >= forward_bytes();
  std::string text = "caller " + gib(caller) + " GiB + " + (bwd ? "backward " : "forward ") +
                     gib(bwd ? backward_bytes() : forward_bytes()) + " GiB (";
  const auto& terms = bwd ? backward : forward;
  for (size_t i = 0; i < terms.size(); ++i) text += (i ? ", " : "") + terms[i].name + " " + gib(terms[i].bytes);
  return text + ")";
}

CpMemoryEstimate cp_memory_estimate(CommType comm, const CpMemoryShape& s) {
  check_shape(comm, s);
  CpMemoryEstimate m;
  const Sizes z = sizes_of(s, s.tokens_per_rank, s.kv_heads);
  m.caller = caller_bytes(z);
  switch (comm) {
    case CommType::p2p: ring_terms(z, s.cp, m); break;
    case CommType::all_gather: {
      const int64_t others = (s.cp - 1) * z.kv_bytes();
      m.forward.push_back({"gathered K/V (every rank's, rank order)", s.cp * z.kv_bytes()});
      m.forward.push_back({"the others' K/V in sequence order", others});
      m.forward.push_back({"running out and lse (fp32)", z.t * z.a * (z.o + z.l)});
      m.forward.push_back({"tile results in flight (2)", 2 * z.tile_out_bytes()});
      m.backward.push_back({"re-gathered K/V and the others' in sequence order", s.cp * z.kv_bytes() + others});
      m.backward.push_back({"dQ accumulator (fp32)", z.t * z.a * z.q});
      m.backward.push_back({"the others' dK/dV (fp32 accumulators, reduce-scatter input)",
                            (s.cp - 1) * z.t * z.a * (z.k + z.v) + s.cp * z.kv_bytes()});
      m.backward.push_back({"tile dQ, dK, dV", z.t * z.e * z.q + others});
      m.backward.push_back({"kernel workspace (fp32 dQ, row sums)", z.kernel_workspace()});
      break;
    }
    case CommType::a2a: {
      Sizes heads = sizes_of(s, s.tokens_per_rank, std::max(s.kv_heads, s.cp));  // KV heads replicated up to P
      ulysses_terms(heads, m);
      m.backward.push_back({"kernel dQ, dK, dV", heads.t * heads.e * (heads.q + heads.k + heads.v)});
      m.backward.push_back({"kernel workspace (fp32 dQ, row sums)", heads.kernel_workspace()});
      break;
    }
    case CommType::a2a_p2p: {
      const Sizes heads = sizes_of(s, s.tokens_per_rank, std::max(s.kv_heads, s.a2a));
      ulysses_terms(heads, m);
      ring_terms(heads, s.cp / s.a2a, m);
      break;
    }
  }
  return m;
}

CpMemoryEstimate single_device_memory_estimate(const CpMemoryShape& s) {
  CPF_CHECK(s.tokens_per_rank > 0 && s.cp >= 1,
            "single-device memory estimate: tokens_per_rank and cp must be "
            "positive: T=",
            s.tokens_per_rank, " cp=", s.cp);
  const Sizes z = sizes_of(s, s.tokens_per_rank * s.cp, s.kv_heads);
  CpMemoryEstimate m;
  m.caller = caller_bytes(z);
  // The kernel's out and lse are the caller's; the forward holds nothing besides.
  m.backward.push_back({"kernel workspace (fp32 dQ, row sums)", z.kernel_workspace()});
  return m;
}

}  // namespace cpf::cp
