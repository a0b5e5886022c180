#include "models/memory_model.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>

#include "framework/core/error.h"
#include "framework/tensor/ops/classifier_loss.h"

namespace cpf::models {
namespace {

// The attention shapes of a block: query heads, key/value heads, dims per head.
struct AttentionDims {
  int64_t heads = 0, kv_heads = 0, d_qk = 0, d_v = 0;
};

AttentionDims attention_dims(const GPTOptions& o) {
  if (o.attention == AttentionType::mla) {
    const int64_t d_qk = o.qk_nope_head_dim + o.qk_rope_head_dim;
    return {o.num_heads, o.num_heads, d_qk, o.v_head_dim};
  }
  const int64_t d = o.head_dim > 0 ? o.head_dim : o.hidden_size / o.num_heads;
  const int64_t kv = o.attention == AttentionType::gqa ? o.num_kv_heads : o.num_heads;
  return {o.num_heads, kv, d, d};
}

// Parameters of one attention module (projections, latent norms, sinks).
int64_t attention_parameters(const GPTOptions& o) {
  const int64_t c = o.hidden_size, b = o.bias ? 1 : 0;
  const AttentionDims a = attention_dims(o);
  auto linear = [b](int64_t in, int64_t out) { return in * out + b * out; };
  int64_t n = o.attention_sink ? a.heads : 0;
  if (o.attention == AttentionType::mla) {
    n += o.q_lora_rank > 0 ? linear(c, o.q_lora_rank) + o.q_lora_rank + linear(o.q_lora_rank, a.heads * a.d_qk)
                           : linear(c, a.heads * a.d_qk);
    n += linear(c, o.kv_lora_rank + o.qk_rope_head_dim) + o.kv_lora_rank;
    n += linear(o.kv_lora_rank, a.heads * (o.qk_nope_head_dim + o.v_head_dim));
    return n + linear(a.heads * a.d_v, c);
  }
  return n + linear(c, (a.heads + 2 * a.kv_heads) * a.d_qk) + linear(a.heads * a.d_v, c);
}

// Values a token holds in the projections' outputs of one block (q, k, v as the GEMMs write them).
int64_t qkv_width(const GPTOptions& o) {
  const AttentionDims a = attention_dims(o);
  if (o.attention != AttentionType::mla) return (a.heads + 2 * a.kv_heads) * a.d_qk;
  // q, the latent (kv_lora + rope) and its norm, the expanded k/v and the assembled k.
  return a.heads * a.d_qk + 2 * (o.kv_lora_rank + o.qk_rope_head_dim) + a.heads * (o.qk_nope_head_dim + o.v_head_dim) +
         a.heads * a.d_qk;
}

// Whether the FP8 linears' one-byte copies are counted: run.precision fp8 (bf16 activations), attention
// mha or gqa, and every projection's in and out widths multiples of 16 (what the FP8 GEMM takes,
// fp8_autocast.h; a model with any other width is counted as bf16, as most of its linears then are). MLA's
// projections under FP8 are counted as in bf16 (an overestimate).
bool fp8_linears_counted(const GPTOptions& o, double act) {
  if (!o.fp8_linears || act != 2.0 || o.attention == AttentionType::mla) return false;
  const AttentionDims a = attention_dims(o);
  const int64_t widths[] = {o.hidden_size, qkv_width(o), a.heads * a.d_v, effective_intermediate_size(o)};
  for (int64_t w : widths) {
    if (w % 16 != 0) return false;
  }
  return true;
}

// Bytes one token keeps per block between the forward and the backward, per recompute mode.
struct BlockBytes {
  double kept = 0;       // held from the block's forward to its backward
  double transient = 0;  // a block's backward at its peak: its activations (when recomputed) and gradients
};

BlockBytes block_bytes_per_token(const GPTOptions& o, double act, double param, RecomputeMode mode, bool fp8) {
  const AttentionDims a = attention_dims(o);
  const double c = static_cast<double>(o.hidden_size), i = static_cast<double>(effective_intermediate_size(o));
  const bool swiglu = o.mlp == nn::Activation::swiglu;
  // RoPE's outputs are not counted: measured on an H100 (docs/long_context.md), they cost nothing beyond
  // the projection's output the attention's inputs share.
  // FP8 linears (mha/gqa; docs/fp8.md) keep their inputs as one-byte FP8 copies, not the bf16 tensors: the
  // norms' outputs and the MLP's hidden activation, which nothing else keeps, shrink to one byte; the
  // attention output is kept by the attention too, so the output projection's copy comes on top.
  const double linear_in = fp8 ? 1.0 : act;
  const double out_width = static_cast<double>(a.heads * a.d_v);
  const double qkv = act * static_cast<double>(qkv_width(o));
  const double attn = act * out_width + 4.0 * static_cast<double>(a.heads);
  const double mlp = act * (swiglu ? 2.0 * i : i) + linear_in * i;  // gate-up | pre, and the hidden (out)
  const double norms = 2.0 * (param * c + linear_in * c + 4.0);     // x1, y, rstd of both norms
  const double whole = norms + qkv + attn + (fp8 ? out_width : 0.0) + mlp + act * c;  // + the MLP output (pending)
  const double input = param * c + act * c;  // the block's input: stream and pending
  switch (mode) {
    case RecomputeMode::none: return {whole, input + act * (swiglu ? 3.0 : 2.0) * i};  // the MLP's gradients
    case RecomputeMode::full: return {input, whole + input};                           // a recomputed block's backward
    case RecomputeMode::selective: {
      const double gemm_outputs = qkv + attn + act * c + act * (swiglu ? 2.0 : 1.0) * i;
      return {input + gemm_outputs, whole - gemm_outputs + input};
    }
  }
  return {whole, input};
}

// All blocks: what they keep per token (each by its recompute mode and precision: fp8.bf16_first_blocks and
// _last_blocks stay bf16), the peak of one block's backward (a recomputed one's when any is), and how many
// run their linears in FP8 (and of those, how many are recomputed).
struct BlocksBytes {
  double kept = 0, transient = 0;
  int64_t fp8_layers = 0, fp8_covered = 0;
};

BlocksBytes blocks_bytes_per_token(const GPTOptions& o, double act, double param, int64_t covered) {
  BlocksBytes out;
  for (int64_t i = 0; i < o.num_layers; ++i) {
    const bool fp8 = fp8_linears_counted(o, act) && fp8_block(o.fp8_scaling, i, o.num_layers);
    const bool recomputed = i < covered;
    const BlockBytes b = block_bytes_per_token(o, act, param, recomputed ? o.recompute : RecomputeMode::none, fp8);
    out.kept += b.kept;
    if (recomputed == (covered > 0)) out.transient = std::max(out.transient, b.transient);
    out.fp8_layers += fp8 ? 1 : 0;
    out.fp8_covered += fp8 && recomputed ? 1 : 0;
  }
  return out;
}

// What the CP strategy holds beside the blocks' activations while one attention runs (K/V in flight).
double cp_attention_bytes(const MemoryPlanInput& in, double act, int64_t tokens) {
  if (in.cp <= 1) return 0;
  const AttentionDims a = attention_dims(in.model);
  const double kv_token = act * static_cast<double>(a.kv_heads * (a.d_qk + a.d_v));
  const double t = static_cast<double>(tokens);
  if (in.cp_comm_type == "all_gather") return 2.0 * static_cast<double>(in.cp) * t * kv_token;  // K/V and dK/dV
  if (in.cp_comm_type == "a2a") return 2.0 * t * act * static_cast<double>(qkv_width(in.model) + a.heads * a.d_v);
  return 4.0 * t * kv_token;  // p2p, a2a+p2p: a tile received while one is used, and their gradients
}

}  // namespace

double MemoryEstimate::total() const {
  return master_weights + compute_copies + gradients + moments + activations + attention + communication + loss;
}

std::string format_gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / double(int64_t{1} << 30));
  return buf;
}

std::vector<std::string> MemoryEstimate::lines() const {
  const std::pair<const char*, double> parts[] = {{"master weights", master_weights},
                                                  {"compute copies", compute_copies},
                                                  {"gradients", gradients},
                                                  {"optimizer moments", moments},
                                                  {"activations", activations},
                                                  {"attention (CP)", attention},
                                                  {"communication", communication},
                                                  {"loss", loss},
                                                  {"total", total()}};
  std::vector<std::string> out;
  for (const auto& [name, bytes] : parts) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "  %-18s %12s", name, format_gib(bytes).c_str());
    out.emplace_back(buf);
  }
  return out;
}

namespace {

int64_t norm_parameters(const GPTOptions& o) {
  return o.norm == NormType::layernorm && o.bias ? 2 * o.hidden_size : o.hidden_size;
}

}  // namespace

int64_t block_parameters(const GPTOptions& o) {
  const int64_t c = o.hidden_size, i = effective_intermediate_size(o), b = o.bias ? 1 : 0;
  const int64_t norm = norm_parameters(o);
  const int64_t mlp = o.mlp == nn::Activation::swiglu ? 3 * c * i + b * (2 * i + c) : 2 * c * i + b * (i + c);
  return 2 * norm + attention_parameters(o) + mlp;
}

int64_t count_parameters(const GPTOptions& o) {
  const int64_t c = o.hidden_size;
  const int64_t norm = o.norm == NormType::layernorm && o.bias ? 2 * c : c;
  int64_t n = o.vocab_size * c + (o.positions == PositionType::learned ? o.max_positions * c : 0);
  n += o.num_layers * block_parameters(o) + norm;
  if (!o.tie_embeddings) n += o.vocab_size * c;
  return n;
}

MemoryEstimate estimate_memory(const MemoryPlanInput& in) {
  const GPTOptions& o = in.model;
  CPF_CHECK(in.seq_len >= 1 && in.rows >= 1 && in.cp >= 1 && in.ranks >= in.cp, "memory model: seq_len=", in.seq_len,
            " rows=", in.rows, " cp=", in.cp, " ranks=", in.ranks, " must be positive with ranks >= cp");
  CPF_CHECK(o.vocab_size >= 1, "memory model: vocab_size=", o.vocab_size, " must be resolved (> 0)");
  const double param = static_cast<double>(dtype_size(o.dtype)), act = in.bf16 ? 2.0 : param;
  MemoryEstimate e;
  e.parameters = count_parameters(o);
  e.tokens_per_rank = in.rows * ((in.seq_len + in.cp - 1) / in.cp);
  const double n = static_cast<double>(e.parameters), t = static_cast<double>(e.tokens_per_rank);
  e.master_weights = n * param;
  e.compute_copies = in.bf16 ? n * 2.0 : 0.0;
  e.moments = in.optimizer == "adamw" ? 2.0 * n * param : (in.momentum ? n * param : 0.0);
  const double ranks = static_cast<double>(in.ranks);
  if (in.shard != "none") e.moments /= ranks;  // each rank keeps the state of 1/ranks of every bucket
  e.communication = in.ranks > 1 ? n * param : 0.0;
  if (in.shard == "gradients" || in.shard == "parameters") {
    // The reduced shards (1/ranks of the gradients) and the flat buckets in flight: about two (25 MB each
    // under gradients; two blocks under parameters, whose buckets are the blocks).
    const double block = static_cast<double>(block_parameters(o)) * param;
    e.communication = n * param / ranks + 2.0 * (in.shard == "parameters" ? block : 25.0 * (1 << 20));
  }
  if (in.shard == "parameters") {
    // The owned pieces, and what is whole at once: the root (embeddings, final norm, head) and two blocks (the
    // one running and the one prefetched); the bf16 copies are cast per use of those.
    const double whole =
        static_cast<double>(e.parameters - o.num_layers * block_parameters(o) + 2 * block_parameters(o));
    e.master_weights = n * param / ranks + whole * param;
    e.compute_copies = in.bf16 ? whole * 2.0 : 0.0;
  }

  const int64_t layers = o.num_layers;
  const int64_t covered =
      o.recompute == RecomputeMode::none ? 0 : (o.recompute_layers == 0 ? layers : o.recompute_layers);
  const BlocksBytes blocks = blocks_bytes_per_token(o, act, param, covered);
  const double c = static_cast<double>(o.hidden_size);
  if (blocks.fp8_layers > 0) {
    // Each FP8 linear keeps its weight's transposed FP8 copy (one byte a parameter) for dX: every FP8 block's
    // until its backward, but for fully recomputed blocks, whose copies live while one block recomputes.
    // With fp8.cache_weights (resident parameters) the step keeps both copies of every weight from its
    // first cast to the step's end (fp8_weight_cache.h): two bytes a parameter of every FP8 block.
    const int64_t holding = o.recompute == RecomputeMode::full
                                ? blocks.fp8_layers - blocks.fp8_covered + (blocks.fp8_covered > 0 ? 1 : 0)
                                : blocks.fp8_layers;
    const bool cached = o.fp8_scaling.cache_weights && in.shard != "parameters";
    const int64_t linear = block_parameters(o) - 2 * norm_parameters(o);  // a block's linear weights and biases
    e.compute_copies += static_cast<double>((cached ? 2 * blocks.fp8_layers : holding) * linear);
    // The FP8 GEMMs cast the f32 masters themselves: those weights get no bf16 copy (2 bytes a parameter) in
    // the FP8 blocks whose copies exist (all of them, or the two whole at once under parameters sharding).
    const int64_t copied = in.shard == "parameters" ? std::min<int64_t>(2, blocks.fp8_layers) : blocks.fp8_layers;
    e.compute_copies -= 2.0 * static_cast<double>(copied * linear);
  }
  const double stream = param * c + (param + act) * c;  // the embedding's output; the final norm's x and y
  e.activations = t * (blocks.kept + blocks.transient + stream);
  e.attention = cp_attention_bytes(in, act, e.tokens_per_rank);

  const double v = static_cast<double>(o.vocab_size);
  const int64_t chunk = raw::classifier_chunk_rows(o.classifier_chunk_rows > 0 ? o.classifier_chunk_rows : 0,
                                                   e.tokens_per_rank, o.vocab_size, in.bf16 ? DType::bf16 : o.dtype);
  const double grad_dtype = in.bf16 ? 4.0 : param;  // the fused classifier's d(hidden) and d(weight)
  // One chunk of logits (its gradient is written over it), d(hidden) and the head weight's gradient.
  e.loss = static_cast<double>(chunk) * v * act + t * c * grad_dtype + v * c * grad_dtype;
  // The peak is where the backward starts (every kept activation, the loss's buffers, the last block's
  // backward) or where it ends (every gradient, the activations freed): each block's backward frees its
  // activations as it allocates its parameters' gradients. So the gradients count only by what they
  // exceed the activations and the loss by (measured on H100s: docs/long_context.md).
  const double shards = in.shard == "gradients" || in.shard == "parameters" ? ranks : 1.0;
  e.gradients = std::max(0.0, n * param / shards - e.activations - e.loss);
  return e;
}

std::optional<int64_t> largest_fitting_seq_len(MemoryPlanInput in, double capacity, int64_t multiple, int64_t limit) {
  CPF_CHECK(multiple >= 1 && limit >= multiple, "memory model: multiple=", multiple, " limit=", limit);
  auto fits = [&](int64_t steps) {
    in.seq_len = steps * multiple;
    return estimate_memory(in).total() <= capacity;
  };
  if (!fits(1)) return std::nullopt;
  int64_t lo = 1, hi = limit / multiple;  // fits(lo); the estimate grows with seq_len
  if (fits(hi)) return hi * multiple;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo * multiple;
}

double device_capacity_bytes(const std::string& name) {
  std::string s;
  for (char ch : name) s += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  const double gib = double(int64_t{1} << 30);
  if (s == "h100") return 79.2 * gib;  // what an 80 GB H100 reports as total
  if (s == "h200") return 139.8 * gib;
  size_t digits = 0;
  while (digits < s.size() && (std::isdigit(static_cast<unsigned char>(s[digits])) || s[digits] == '.')) ++digits;
  const std::string unit = s.substr(digits);
  double value = 0;
  try {
    value = digits > 0 ? std::stod(s.substr(0, digits)) : 0;
  } catch (const std::exception&) {
    value = 0;
  }
  const double scale = unit == "gib" || unit == "g" ? gib : unit == "gb" ? 1e9 : 0;
  CPF_CHECK(value > 0 && scale > 0, "memory model: unknown device '", name,
            "': name h100 or h200, or a size such as 80GiB, 141GB or 64G");
  return value * scale;
}

}  // namespace cpf::models
