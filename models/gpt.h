#pragma once
// GPT: a decoder-only transformer over packed (THD) token batches.
//
//   tokens (T) -> embed_tokens (+ embed_positions when positions: learned)            x (T, C)
//   blocks.i:   x = x + attn(attn_norm(x))     mha | gqa | mla, RoPE inside (positions: rope)
//               x = x + mlp(mlp_norm(x))       gelu | swiglu
//   final_norm -> lm_head (or the token embedding, tied)                          logits (T, V)
//
// Every sequence of the batch is one document (SequenceInfo), so attention never crosses documents:
// the mask is causal inside each sequence. Under context parallelism the tokens are this rank's
// dual-chunk shard and the SequenceInfo describes the global batch (attention/cp/context_parallel.h).
//
// Init (GPT-2 / Llama): every weight normal(0, init_std), residual output projections (attention
// o_proj, MLP fc_out/down_proj) normal(0, init_std / sqrt(2 * num_layers)), biases 0, norm gains 1.
//
// Precision (options.compute_dtype, nn::Precision): parameters and the residual stream x stay in
// options.dtype (f32). With bf16 compute each norm runs on the f32 stream, fused with the residual add
// before it, and writes its output in bf16 (framework/tensor/ops/add_norm.h), so the attention and MLP
// projections, RoPE, attention and activations run in bf16 and each sub-block's bf16 output is widened
// inside the next fused add. The Linear layers use bf16 copies of the f32 weights made once per step
// (nn::ComputeCopies, refreshed by forward). The LM head gives bf16 logits, and the loss computes in f32
// (cross_entropy widens bf16).
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attention/cp/context_parallel.h"
#include "attention/nn/kv_cache.h"
#include "attention/sequence_info.h"
#include "framework/autograd/fp8_scaling.h"
#include "framework/autograd/fp8_weight_cache.h"
#include "framework/autograd/functions/add_norm.h"
#include "framework/config/schema.h"
#include "framework/core/generator.h"
#include "framework/nn/compute_copies.h"
#include "framework/nn/embedding.h"
#include "framework/nn/linear.h"
#include "framework/nn/mlp.h"
#include "framework/nn/module.h"
#include "framework/nn/parameter_units.h"
#include "framework/nn/precision.h"
#include "framework/tensor/rope_frequencies.h"

namespace cpf::models {

enum class AttentionType { mha, gqa, mla };
enum class NormType { rmsnorm, layernorm };
enum class PositionType { rope, learned };
// Activation recomputation of the blocks (framework/autograd/checkpoint.h): none keeps every activation
// for the backward; full keeps each block's input and re-runs the block inside the backward; selective
// also keeps the outputs of its GEMMs and of attention and recomputes only norms, RoPE and activations.
enum class RecomputeMode { none, selective, full };

// The `model:` section of a training config; field names are the YAML keys.
struct GPTOptions {
  int64_t vocab_size = 0;  // 0 = the data source's vocabulary
  int64_t hidden_size = 128;
  int64_t num_layers = 2;
  int64_t num_heads = 4;
  AttentionType attention = AttentionType::mha;
  int64_t num_kv_heads = 0;  // gqa: key/value heads, a divisor of num_heads (1 = MQA)
  int64_t head_dim = 0;      // mha/gqa: 0 = hidden_size / num_heads
  // mla (DeepSeek-V2): latent ranks and head dims
  int64_t q_lora_rank = 0;  // 0 = a direct q projection
  int64_t kv_lora_rank = 64;
  int64_t qk_nope_head_dim = 32;
  int64_t qk_rope_head_dim = 16;
  int64_t v_head_dim = 32;
  int64_t window = -1;          // sliding window: keys at most `window` positions back; -1 = unbounded
  bool attention_sink = false;  // a learnable logit per query head in every softmax denominator (gpt-oss)
  nn::Activation mlp = nn::Activation::gelu;
  int64_t intermediate_size = 0;  // 0 = 4 * hidden (gelu) or 8/3 * hidden rounded up to 8 (swiglu)
  NormType norm = NormType::rmsnorm;
  double norm_eps = 1e-5;
  PositionType positions = PositionType::rope;
  int64_t max_positions = 1024;  // learned: size of the position table
  double rope_base = 10000.0;
  RopeScaling rope_scaling{};  // Llama 3's frequency scaling (framework/tensor/rope_frequencies.h)
  bool tie_embeddings = true;
  bool bias = false;
  double init_std = 0.02;
  // Training loss: rows per chunk of the fused LM head + cross-entropy (GPT::forward_loss); 0 = chosen by
  // memory, -1 = the unfused path (the whole (T, V) logits, then cross_entropy).
  int64_t classifier_chunk_rows = 0;
  RecomputeMode recompute = RecomputeMode::none;  // activation recomputation of the blocks
  int64_t recompute_layers = 0;                   // recompute the first N blocks only; 0 = every block
  DType dtype = DType::f32;                       // not a YAML key: f32 for training, f64 for gradchecks
  // Not YAML keys of this section (the trainer sets them from run.precision and attention:):
  std::optional<DType> compute_dtype;   // nullopt = dtype; bf16: mixed precision over f32 parameters
  bool fp8_linears = false;             // the blocks' linear layers in FP8 (run.precision: fp8; docs/fp8.md)
  Fp8ScalingOptions fp8_scaling;        // their scaling recipe (run.fp8)
  AttentionKernelConfig kernel_config;  // kernel choice of every attention call (backend, deterministic)
};

template <class V>
void describe(V& v, GPTOptions& o) {
  using config::Choices;
  using config::Range;
  v.field("vocab_size", o.vocab_size, "vocabulary size; 0 = the data source's", Range{0, 1e7});
  v.field("hidden_size", o.hidden_size, "model width C", Range{1, 65536});
  v.field("num_layers", o.num_layers, "transformer blocks", Range{1, 1024});
  v.field("num_heads", o.num_heads, "query heads", Range{1, 1024});
  v.choice(
      "attention", o.attention,
      Choices<AttentionType>{{"mha", AttentionType::mha}, {"gqa", AttentionType::gqa}, {"mla", AttentionType::mla}},
      "multi-head, grouped-query (num_kv_heads) or multi-head latent attention");
  v.field("num_kv_heads", o.num_kv_heads, "gqa: key/value heads, dividing num_heads (1 = MQA); 0 = num_heads",
          Range{0, 1024});
  v.field("head_dim", o.head_dim, "mha/gqa: dims per head; 0 = hidden_size / num_heads", Range{0, 4096});
  v.field("q_lora_rank", o.q_lora_rank, "mla: rank of the query latent; 0 = a direct q projection", Range{0, 65536});
  v.field("kv_lora_rank", o.kv_lora_rank, "mla: rank of the key/value latent", Range{1, 65536});
  v.field("qk_nope_head_dim", o.qk_nope_head_dim, "mla: query/key dims per head without RoPE", Range{0, 4096});
  v.field("qk_rope_head_dim", o.qk_rope_head_dim, "mla: decoupled RoPE dims (even)", Range{2, 4096});
  v.field("v_head_dim", o.v_head_dim, "mla: value dims per head", Range{1, 4096});
  v.field("window", o.window, "sliding-window attention: keys at most this many positions back; -1 = unbounded",
          Range{-1, 1e9});
  v.field("attention_sink", o.attention_sink,
          "a learnable logit per query head in every softmax denominator (parameter attn.sinks, gpt-oss)");
  v.choice("mlp", o.mlp, Choices<nn::Activation>{{"gelu", nn::Activation::gelu}, {"swiglu", nn::Activation::swiglu}},
           "feed-forward block: GELU (GPT-2) or SwiGLU (Llama)");
  v.field("intermediate_size", o.intermediate_size,
          "feed-forward width; 0 = 4 x hidden_size (gelu) or 8/3 x hidden_size rounded up to 8 (swiglu)",
          Range{0, 1 << 20});
  v.choice("norm", o.norm, Choices<NormType>{{"rmsnorm", NormType::rmsnorm}, {"layernorm", NormType::layernorm}},
           "normalisation before each sub-block and at the end");
  v.field("norm_eps", o.norm_eps, "epsilon of the norms", Range{1e-12, 1});
  v.choice("positions", o.positions,
           Choices<PositionType>{{"rope", PositionType::rope}, {"learned", PositionType::learned}},
           "rotary embeddings inside attention, or a learned position table added to the token embedding");
  v.field("max_positions", o.max_positions, "learned: positions in the table (>= data.seq_len)", Range{1, 1 << 24});
  v.field("rope_base", o.rope_base, "RoPE frequency base", Range{1, 1e9});
  v.section("rope_scaling", o.rope_scaling,
            "Llama 3's RoPE frequency scaling (Llama 3.1 / 3.2 checkpoints' rope_scaling); factor 1 = none");
  v.field("tie_embeddings", o.tie_embeddings, "the LM head reuses the token embedding");
  v.field("bias", o.bias, "biases in the linear layers (and LayerNorm)");
  v.field("init_std", o.init_std, "std of the normal init; residual projections get init_std / sqrt(2 x num_layers)",
          Range{1e-8, 10});
  v.field("classifier_chunk_rows", o.classifier_chunk_rows,
          "training loss: rows per chunk of the fused LM head + cross-entropy (no whole logits); 0 = by memory "
          "(1 GiB of logits a chunk), -1 = the unfused path",
          Range{-1, 1e9});
  v.choice("recompute", o.recompute,
           Choices<RecomputeMode>{
               {"none", RecomputeMode::none}, {"selective", RecomputeMode::selective}, {"full", RecomputeMode::full}},
           "activation recomputation: none keeps every activation; full keeps each block's input and re-runs the "
           "block in the backward; selective keeps the GEMM and attention outputs and recomputes norms, RoPE and "
           "activations");
  v.field("recompute_layers", o.recompute_layers,
          "recompute: the first N blocks only (the rest keep their activations); 0 = every block", Range{0, 1024});
}

// The first problem of `o` as {key, "key=value problem"} (key relative to the section), or nullopt.
// The config reader turns it into a file:line:column error; the GPT constructor throws it.
struct OptionProblem {
  std::string key;
  std::string message;
};
std::optional<OptionProblem> check_options(const GPTOptions& o);

// intermediate_size with its default applied.
int64_t effective_intermediate_size(const GPTOptions& o);

// One batch as the model sees it (models/gpt_input.h builds it from the data loader's batches).
struct GPTInput {
  Tensor tokens;     // (T) i64: this rank's tokens in THD storage order
  Tensor positions;  // (T) i64: each token's position inside its sequence
  SequenceInfo seq;  // the batch's sequences; under CP the GLOBAL batch's
};

class GPTBlock;
struct BlockOutput;

class GPT : public nn::Module {
 public:
  // Parameters are drawn from `gen` in construction order, so equal seeds give equal models.
  explicit GPT(const GPTOptions& options, Generator* gen = nullptr);

  // logits (T, vocab_size). `cp`: context parallelism (null or a group of size 1 = none).
  Tensor forward(const GPTInput& input, const cp::ContextParallel* cp = nullptr) const;

  // Incremental decoding (models/gpt_decoder.h drives it): tokens (T_new) i64 are `step`'s new tokens
  // packed per sequence (attention/nn/kv_cache.h), `caches` one KVCache per block. Returns their
  // logits (T_new, vocab_size): the rows forward() gives for the same tokens over each whole prefix.
  // Under NoGradGuard, without CP.
  Tensor forward_cached(const Tensor& tokens, const nn::KVCacheStep& step, std::vector<nn::KVCache>& caches) const;

  // The summed cross-entropy over labels != -100 divided by `normalizer` (the number of valid labels
  // over every rank sharing the step, >= 1), so that summing it over those ranks gives their mean. The
  // loss is f32 for f32 or bf16 logits. `valid_labels`: the count of labels != -100 when the caller
  // knows it (-1 counts them, which reads device labels back to the host).
  static Tensor loss(const Tensor& logits, const Tensor& labels, int64_t normalizer, int64_t valid_labels = -1);

  // loss(forward(input, cp), labels, normalizer) without the (T, V) logits when grad mode is on: the
  // final hidden states go through the fused classifier (framework/autograd/functions/classifier_loss.h)
  // in chunks of options().classifier_chunk_rows rows, which also computes the head's gradients
  // during the forward, so the returned loss must be the end of the graph (backward(loss) or a multiple
  // of it). labels (T) i64/i32 with -100 ignored; valid_labels as for loss() (the unfused path uses it).
  // classifier_chunk_rows = -1: the unfused path (identical results up to rounding). Grad mode off: the
  // fused path computes the loss alone (evaluation at long contexts never holds the whole logits).
  // normalizer_tensor: undefined, or `normalizer` as a () f64 on the model's device that the fused path reads
  // there (ClassifierLossOptions::normalizer_tensor: what a captured CUDA graph replays with new counts).
  Tensor forward_loss(const GPTInput& input, const Tensor& labels, int64_t normalizer, int64_t valid_labels = -1,
                      const cp::ContextParallel* cp = nullptr, const Tensor& normalizer_tensor = Tensor()) const;

  const GPTOptions& options() const { return options_; }
  // The per-step bf16 copies of the parameters (mixed precision; framework/nn/compute_copies.h).
  const nn::ComputeCopies& compute_copies() const { return compute_copies_; }
  nn::Precision precision() const {
    return {.param = options_.dtype, .compute = options_.compute_dtype.value_or(options_.dtype)};
  }
  // Where the parameters live (Module::to moves them); inputs must be there too.
  Device device() const { return embed_tokens_->weight().device(); }

  // Sharded parameters (parallel.shard: parameters; framework/nn/parameter_units.h): from now on each
  // forward acquires unit `num_layers` (the root: every parameter outside the blocks) at its start and
  // keeps it (the caller releases it after the backward), and acquires block i's unit i around the
  // block's forward and around its recompute in the backward, prefetching the next block's. Needs
  // recomputation of every block (else a block's graph would keep its whole weights), checked here.
  // Null: every parameter resident (the default). `units` must outlive its use.
  void set_parameter_units(const nn::ParameterUnits* units);
  // The parameter indices (named_parameters() order) of each unit: blocks 0..L-1, then the root.
  std::vector<std::vector<size_t>> parameter_units() const;

  // run.precision: fp8 with the delayed recipe: the scaling state of the blocks' FP8 linears (made on the
  // model's device at first use; the trainer updates, reduces and checkpoints it). Null for any other run.
  Fp8ScalingState* fp8_scaling() const;
  // run.precision: fp8 with fp8.cache_weights and resident parameters: the FP8 weight copies the blocks'
  // linears keep for the rest of a step while the trainer holds a step scope open around the step's
  // forwards and backwards (framework/autograd/fp8_weight_cache.h). Null otherwise: casts at every call.
  Fp8WeightCache* fp8_weight_cache() const;

 private:
  Tensor embed(const Tensor& tokens, const Tensor& positions) const;  // (T, C) residual stream
  // The checked input through the embedding, the blocks and the final norm: (T, C) in the compute dtype.
  Tensor hidden(const GPTInput& input, const cp::ContextParallel* cp) const;
  Tensor head(const Tensor& x) const;     // (T, C) -> logits (T, V)
  Tensor head_weight(DType dtype) const;  // (V, C) in `dtype`: lm_head or the tied embedding, cast per use
  // Mixed precision: the step's bf16 parameter copies refreshed (one multi-tensor cast for those that
  // changed) and made the ones Linear and compute_parameter use while the scope lives (compute_copies.h).
  nn::ComputeCopiesScope use_compute_copies() const;
  // The last block's pending MLP output added to x inside final_norm (fused), then the LM head.
  Tensor logits(const Tensor& x, const Tensor& pending) const;
  // Block i on `in`, through activation recomputation when options().recompute covers it.
  BlockOutput run_block(size_t i, const BlockOutput& in, const SequenceInfo& seq, const cp::ContextParallel* cp) const;

  GPTOptions options_;
  std::shared_ptr<nn::Embedding> embed_tokens_, embed_positions_;
  std::vector<std::shared_ptr<GPTBlock>> blocks_;
  std::shared_ptr<nn::Module> final_norm_;
  std::function<AddNormOutput(const Tensor&, const Tensor&, DType)> final_norm_fn_;  // fused add + norm
  std::shared_ptr<nn::Linear> lm_head_;
  mutable nn::ComputeCopies compute_copies_;              // per-step bf16 copies of the f32 parameters
  mutable std::unique_ptr<Fp8ScalingState> fp8_scaling_;  // fp8_scaling()
  mutable Fp8WeightCache fp8_weight_cache_;               // fp8_weight_cache()
  const nn::ParameterUnits* units_ = nullptr;             // sharded parameters, or null
};

}  // namespace cpf::models
