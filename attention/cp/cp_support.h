#pragma once
// The CP support matrix as code: unsupported_reason() says whether a strategy runs a combination, and why not.
// context_parallel_attention calls it before any communication, `cpformer check-config` calls it on
// configs, and docs/cp.md's table is checked against it by a test.
#include <optional>
#include <string>

#include "attention/cp/context_parallel.h"
#include "attention/spec.h"

namespace cpf::cp {

struct CpQuery {
  CommType comm_type = CommType::p2p;
  int64_t cp_size = 2;
  int64_t a2a_size = 1;  // a2a+p2p: size of the a2a sub-group (cp_size = a2a_size * p2p_size)
  QkvFormat format = QkvFormat::bshd;
  MaskType mask = MaskType::causal;
  AttentionWindow window;
  int64_t num_heads = 8;
  int64_t num_kv_heads = 8;
  int64_t head_dim_qk = 64;
  int64_t head_dim_v = 64;
  bool cross_attention = false;  // q and kv sequences differ
  bool attention_sink = false;   // spec.sink: every strategy applies it once per merged row
  bool mla_latent = false;       // MLA latent-KV communication (latent_kv.h): not under a2a
};

// Why `comm_type` cannot move the MLA latent (latent_kv.h), or nullopt.
std::optional<std::string> mla_latent_problem(CommType comm_type);

// nullopt when supported; otherwise the reason, naming the values.
std::optional<std::string> unsupported_reason(const CpQuery& query);

}  // namespace cpf::cp

namespace cpf::cp {

// docs/cp.md's support matrix, rendered from unsupported_reason(): one row per feature (the others at their
// defaults: bshd, causal, 8 heads / 8 KV heads, d = 64, cp = 4 as a2a 2 x p2p 2 for a2a+p2p), one
// column per strategy; a cell is "yes" or the rejection reason. A test keeps the docs equal to it.
std::string support_matrix_markdown();

}  // namespace cpf::cp
