#include "attention/cp/cp_support.h"

#include "framework/core/error.h"

namespace cpf::cp {

std::string comm_type_name(CommType type) {
  switch (type) {
    case CommType::p2p: return "p2p";
    case CommType::all_gather: return "all_gather";
    case CommType::a2a: return "a2a";
    case CommType::a2a_p2p: return "a2a+p2p";
  }
  return "?";
}

CommType parse_comm_type(const std::string& name) {
  for (CommType t : {CommType::p2p, CommType::all_gather, CommType::a2a, CommType::a2a_p2p}) {
    if (comm_type_name(t) == name) return t;
  }
  CPF_FAIL("unknown cp_comm_type '", name, "' (expected one of p2p, all_gather, a2a, a2a+p2p)");
}

namespace {

// Ulysses splits heads over `a2a` ranks; KV heads fewer than that are replicated so each rank gets
// the one KV head its query heads use. That needs the query heads of a rank to share one KV head.
std::optional<std::string> check_heads(const CpQuery& q, int64_t a2a, const std::string& what) {
  const std::string name = comm_type_name(q.comm_type);
  if (q.num_heads % a2a != 0) {
    return name + ": num_heads=" + std::to_string(q.num_heads) + " is not divisible by the " + what + "=" +
           std::to_string(a2a);
  }
  if (q.num_kv_heads >= a2a) {
    if (q.num_kv_heads % a2a != 0) {
      return name + ": num_kv_heads=" + std::to_string(q.num_kv_heads) + " is not divisible by the " + what + "=" +
             std::to_string(a2a) + " (and is not a divisor of it, so it cannot be replicated either)";
    }
  } else if (a2a % q.num_kv_heads != 0) {
    return name + ": num_kv_heads=" + std::to_string(q.num_kv_heads) + " is fewer than the " + what + "=" +
           std::to_string(a2a) + " and does not divide it, so KV heads cannot be replicated evenly";
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> mla_latent_problem(CommType comm_type) {
  if (comm_type != CommType::a2a) return std::nullopt;
  return comm_type_name(comm_type) +
         ": MLA latent communication runs under p2p, all_gather and a2a+p2p (Ulysses "
         "alone moves heads, not K/V blocks); set attention.cp_mla_latent: off or auto";
}

std::optional<std::string> unsupported_reason(const CpQuery& q) {
  const std::string name = comm_type_name(q.comm_type);
  if (q.cp_size < 2) {
    return name + ": the CP group has size " + std::to_string(q.cp_size) +
           "; context parallelism needs at least 2 ranks (a missing or size-1 group would silently run "
           "without CP)";
  }
  if (q.cross_attention) {
    return name +
           ": cross-attention (different q and kv sequences) is not supported under context parallelism; "
           "every strategy shards q and kv with one dual-chunk layout";
  }
  if (q.num_heads <= 0 || q.num_kv_heads <= 0 || q.num_heads % q.num_kv_heads != 0) {
    return name + ": num_heads=" + std::to_string(q.num_heads) +
           " must be a positive multiple of num_kv_heads=" + std::to_string(q.num_kv_heads);
  }
  if (q.window.left < -1 || q.window.right < -1) {
    return name + ": window (" + std::to_string(q.window.left) + ", " + std::to_string(q.window.right) +
           ") has an entry below -1";
  }
  if (is_causal(q.mask) && q.window.right > 0) {
    return name + ": a causal mask cannot look ahead: window right=" + std::to_string(q.window.right);
  }
  if (q.mla_latent) {
    if (auto reason = mla_latent_problem(q.comm_type)) return reason;
  }
  switch (q.comm_type) {
    case CommType::p2p:
    case CommType::all_gather: return std::nullopt;
    case CommType::a2a: return check_heads(q, q.cp_size, "cp size");
    case CommType::a2a_p2p: {
      if (q.a2a_size < 2 || q.cp_size % q.a2a_size != 0 || q.cp_size / q.a2a_size < 2) {
        return name + ": cp size " + std::to_string(q.cp_size) + " must split into a2a size " +
               std::to_string(q.a2a_size) + " x p2p size, both at least 2 (use a2a or p2p for a flat group)";
      }
      return check_heads(q, q.a2a_size, "a2a size");
    }
  }
  return std::nullopt;
}

}  // namespace cpf::cp

namespace cpf::cp {
namespace {

struct MatrixRow {
  const char* feature;
  void (*apply)(CpQuery&);
};

const MatrixRow kRows[] = {
    {"bshd, causal", [](CpQuery&) {}},
    {"sbhd, causal", [](CpQuery& q) { q.format = QkvFormat::sbhd; }},
    {"thd, padding_causal",
     [](CpQuery& q) {
       q.format = QkvFormat::thd;
       q.mask = MaskType::padding_causal;
     }},
    {"thd, padding (no causal)",
     [](CpQuery& q) {
       q.format = QkvFormat::thd;
       q.mask = MaskType::padding;
     }},
    {"no_mask", [](CpQuery& q) { q.mask = MaskType::no_mask; }},
    {"bshd, padding_causal (per-row lengths)", [](CpQuery& q) { q.mask = MaskType::padding_causal; }},
    {"sliding window, causal (left 128)",
     [](CpQuery& q) {
       q.window = {128, 0};
     }},
    {"sliding window (left 128, right 64)",
     [](CpQuery& q) {
       q.mask = MaskType::no_mask;
       q.window = {128, 64};
     }},
    {"thd + sliding window",
     [](CpQuery& q) {
       q.format = QkvFormat::thd;
       q.mask = MaskType::padding_causal;
       q.window = {128, 0};
     }},
    {"GQA (8 q / 4 kv heads)", [](CpQuery& q) { q.num_kv_heads = 4; }},
    {"MQA (8 q / 1 kv head)", [](CpQuery& q) { q.num_kv_heads = 1; }},
    {"KV heads < a2a size (8 q / 2 kv, cp 4)", [](CpQuery& q) { q.num_kv_heads = 2; }},
    {"MLA (d_qk 192, d_v 128)",
     [](CpQuery& q) {
       q.head_dim_qk = 192;
       q.head_dim_v = 128;
     }},
    {"GQA + MLA",
     [](CpQuery& q) {
       q.num_kv_heads = 2;
       q.head_dim_qk = 192;
       q.head_dim_v = 128;
     }},
    {"MLA moving its latent (attention.cp_mla_latent)",
     [](CpQuery& q) {
       q.head_dim_qk = 192;
       q.head_dim_v = 128;
       q.mla_latent = true;
     }},
    {"attention sink (learnable logit per query head)", [](CpQuery& q) { q.attention_sink = true; }},
    {"attention sink + GQA + MLA + sliding window",
     [](CpQuery& q) {
       q.attention_sink = true;
       q.num_kv_heads = 2;
       q.head_dim_qk = 192;
       q.head_dim_v = 128;
       q.window = {128, 0};
     }},
    {"heads not divisible by a2a size (6 q / 6 kv, cp 4)",
     [](CpQuery& q) {
       q.num_heads = 6;
       q.num_kv_heads = 6;
     }},
    {"KV heads neither dividing nor divisible (12 q / 3 kv, cp 4)",
     [](CpQuery& q) {
       q.num_heads = 12;
       q.num_kv_heads = 3;
     }},
    {"cross-attention", [](CpQuery& q) { q.cross_attention = true; }},
    {"cp group of size 1", [](CpQuery& q) { q.cp_size = 1; }},
};

}  // namespace

std::string support_matrix_markdown() {
  const CommType types[] = {CommType::p2p, CommType::all_gather, CommType::a2a, CommType::a2a_p2p};
  std::string out = "| feature |";
  for (CommType t : types) out += " " + comm_type_name(t) + " |";
  out += "\n|---|---|---|---|---|\n";
  for (const MatrixRow& row : kRows) {
    out += std::string("| ") + row.feature + " |";
    for (CommType t : types) {
      CpQuery q;
      q.comm_type = t;
      q.cp_size = 4;
      q.a2a_size = t == CommType::a2a_p2p ? 2 : 1;
      row.apply(q);
      const auto reason = unsupported_reason(q);
      out += " " + (reason ? "no: " + *reason : std::string("yes")) + " |";
    }
    out += "\n";
  }
  return out;
}

}  // namespace cpf::cp
