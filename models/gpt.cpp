#include "models/gpt.h"

#include <cmath>
#include <iomanip>
#include <sstream>

#include "framework/autograd/checkpoint.h"
#include "framework/autograd/fp8_autocast.h"
#include "framework/autograd/functions/classifier_loss.h"
#include "framework/autograd/grad_mode.h"
#include "framework/autograd/ops.h"
#include "framework/nn/compute_copies.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/profile.h"
#include "models/gpt_block.h"

namespace cpf::models {
namespace {

// A double as the config would read it back: shortest round-trip form.
std::string format_number(double value) {
  std::ostringstream os;
  os << std::setprecision(17) << value;
  std::string shortest = os.str();
  for (int digits = 1; digits < 17; ++digits) {
    std::ostringstream t;
    t << std::setprecision(digits) << value;
    if (std::stod(t.str()) == value) return t.str();
  }
  return shortest;
}

std::optional<OptionProblem> problem(const std::string& key, int64_t value, const std::string& what) {
  return OptionProblem{key, key + "=" + std::to_string(value) + " " + what};
}

// The blocks as children "0", "1", ... of one "blocks" module, so their parameters are named
// blocks.<i>.* (module names cannot contain dots).
class BlockList : public nn::Module {
 public:
  void add(const std::shared_ptr<GPTBlock>& block) { register_module(std::to_string(size_++), block); }

 private:
  int64_t size_ = 0;
};

// Gives a sharded unit back when the block's forward ends, also by an exception (the other ranks'
// gathers stay matched by the error path that aborts the world).
class UnitHold {
 public:
  UnitHold(const nn::ParameterUnits* units, size_t unit) : units_(units), unit_(unit) {}
  ~UnitHold() {
    if (units_ == nullptr) return;
    try {
      units_->release(unit_);
    } catch (...) {  // already unwinding, or an aborted world: the first error is the one to report
    }
  }
  UnitHold(const UnitHold&) = delete;
  UnitHold& operator=(const UnitHold&) = delete;

 private:
  const nn::ParameterUnits* units_;
  size_t unit_;
};

}  // namespace

std::optional<OptionProblem> check_options(const GPTOptions& o) {
  if (o.vocab_size < 1) return problem("vocab_size", o.vocab_size, "must be positive");
  if (o.hidden_size < 1) return problem("hidden_size", o.hidden_size, "must be positive");
  if (o.num_layers < 1) return problem("num_layers", o.num_layers, "must be positive");
  if (o.num_heads < 1) return problem("num_heads", o.num_heads, "must be positive");
  if (o.attention == AttentionType::gqa) {
    if (o.num_kv_heads < 1 || o.num_heads % o.num_kv_heads != 0) {
      return problem("num_kv_heads", o.num_kv_heads, "must divide num_heads=" + std::to_string(o.num_heads));
    }
  } else if (o.num_kv_heads != 0 && o.num_kv_heads != o.num_heads) {
    return problem(
        "num_kv_heads", o.num_kv_heads,
        "needs attention: gqa (with attention: " + std::string(o.attention == AttentionType::mha ? "mha" : "mla") +
            " every head has its own keys and values)");
  }
  if (o.attention == AttentionType::mla) {
    if (o.kv_lora_rank < 1) return problem("kv_lora_rank", o.kv_lora_rank, "must be positive");
    if (o.q_lora_rank < 0) return problem("q_lora_rank", o.q_lora_rank, "must be >= 0");
    if (o.qk_nope_head_dim < 0) return problem("qk_nope_head_dim", o.qk_nope_head_dim, "must be >= 0");
    if (o.qk_rope_head_dim < 2 || o.qk_rope_head_dim % 2 != 0) {
      return problem("qk_rope_head_dim", o.qk_rope_head_dim, "must be even and at least 2");
    }
    if (o.v_head_dim < 1) return problem("v_head_dim", o.v_head_dim, "must be positive");
  } else {
    if (o.head_dim < 0) return problem("head_dim", o.head_dim, "must be >= 0");
    if (o.head_dim == 0 && o.hidden_size % o.num_heads != 0) {
      return problem("num_heads", o.num_heads,
                     "must divide hidden_size=" + std::to_string(o.hidden_size) + " (or set head_dim)");
    }
    const int64_t head_dim = o.head_dim > 0 ? o.head_dim : o.hidden_size / o.num_heads;
    if (o.positions == PositionType::rope && head_dim % 2 != 0) {
      return problem(o.head_dim > 0 ? "head_dim" : "num_heads", o.head_dim > 0 ? o.head_dim : o.num_heads,
                     "gives an odd head dim of " + std::to_string(head_dim) + "; RoPE rotates pairs of dims");
    }
  }
  if (o.window < -1) return problem("window", o.window, "must be -1 (unbounded) or >= 0");
  if (o.intermediate_size < 0) return problem("intermediate_size", o.intermediate_size, "must be >= 0");
  if (o.max_positions < 1) return problem("max_positions", o.max_positions, "must be positive");
  if (o.recompute_layers < 0 || o.recompute_layers > o.num_layers) {
    return problem("recompute_layers", o.recompute_layers,
                   "must be 0 (every block) or at most num_layers=" + std::to_string(o.num_layers));
  }
  if (o.recompute == RecomputeMode::none && o.recompute_layers != 0) {
    return problem("recompute_layers", o.recompute_layers,
                   "needs model.recompute: selective or full (recompute is none, so no block is recomputed)");
  }
  if (o.classifier_chunk_rows < -1) {
    return problem("classifier_chunk_rows", o.classifier_chunk_rows,
                   "must be -1 (unfused), 0 (by memory) or a row count");
  }
  if (!(o.norm_eps > 0) || !std::isfinite(o.norm_eps)) {
    return OptionProblem{"norm_eps", "norm_eps=" + std::to_string(o.norm_eps) + " must be positive"};
  }
  if (!(o.init_std > 0) || !std::isfinite(o.init_std)) {
    return OptionProblem{"init_std", "init_std=" + std::to_string(o.init_std) + " must be positive"};
  }
  const RopeScaling& rs = o.rope_scaling;
  if (rs.active() && !(rs.low_freq_factor < rs.high_freq_factor)) {
    return OptionProblem{"rope_scaling.high_freq_factor",
                         "rope_scaling.high_freq_factor=" + format_number(rs.high_freq_factor) +
                             " must be above low_freq_factor=" + format_number(rs.low_freq_factor)};
  }
  if (rs.active() && o.positions != PositionType::rope) {
    return OptionProblem{"rope_scaling.factor", "rope_scaling.factor=" + format_number(rs.factor) +
                                                    " scales RoPE, but positions is learned (set positions: rope)"};
  }
  return std::nullopt;
}

int64_t effective_intermediate_size(const GPTOptions& o) {
  if (o.intermediate_size > 0) return o.intermediate_size;
  if (o.mlp == nn::Activation::gelu) return 4 * o.hidden_size;
  // SwiGLU has three matrices: 8/3 x hidden keeps the parameter count of a 4 x hidden GELU MLP.
  const int64_t size = (8 * o.hidden_size + 2) / 3;
  return (size + 7) / 8 * 8;
}

GPT::GPT(const GPTOptions& options, Generator* gen) : options_(options) {
  if (auto p = check_options(options)) CPF_FAIL("GPT: ", p->message);
  nn::check_precision(precision(), "GPT");
  const GPTOptions& o = options_;
  embed_tokens_ = register_module(
      "embed_tokens",
      std::make_shared<nn::Embedding>(
          nn::EmbeddingOptions{
              .num_embeddings = o.vocab_size, .embedding_dim = o.hidden_size, .init_std = o.init_std, .dtype = o.dtype},
          gen));
  if (o.positions == PositionType::learned) {
    embed_positions_ = register_module(
        "embed_positions", std::make_shared<nn::Embedding>(nn::EmbeddingOptions{.num_embeddings = o.max_positions,
                                                                                .embedding_dim = o.hidden_size,
                                                                                .init_std = o.init_std,
                                                                                .dtype = o.dtype},
                                                           gen));
  }
  auto blocks = register_module("blocks", std::make_shared<BlockList>());
  for (int64_t i = 0; i < o.num_layers; ++i) {
    blocks_.push_back(std::make_shared<GPTBlock>(o, gen));
    blocks->add(blocks_.back());
  }
  NormLayer norm = make_norm(o);
  final_norm_ = register_module("final_norm", norm.module);
  final_norm_fn_ = norm.add;
  if (!o.tie_embeddings) {
    lm_head_ = register_module("lm_head", std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = o.hidden_size,
                                                                                         .out_features = o.vocab_size,
                                                                                         .bias = false,
                                                                                         .init_std = o.init_std,
                                                                                         .dtype = o.dtype},
                                                                       gen));
  }
}

Tensor GPT::forward(const GPTInput& in, const cp::ContextParallel* cp) const {
  const nn::ComputeCopiesScope copies = use_compute_copies();
  return head(hidden(in, cp));
}

nn::ComputeCopiesScope GPT::use_compute_copies() const {
  // Sharded parameters are cast per use inside their unit: a refresh at the start would read them all.
  if (!precision().mixed() || units_ != nullptr) return nn::ComputeCopiesScope(nullptr);
  compute_copies_.refresh(parameters(), precision().compute);
  return nn::ComputeCopiesScope(&compute_copies_);
}

Tensor GPT::forward_loss(const GPTInput& in, const Tensor& labels, int64_t normalizer, int64_t valid_labels,
                         const cp::ContextParallel* cp, const Tensor& normalizer_tensor) const {
  const int64_t chunk_rows = options_.classifier_chunk_rows;
  if (chunk_rows < 0) {
    CPF_CHECK(!normalizer_tensor.defined(),
              "GPT::forward_loss: a normalizer_tensor needs the fused classifier "
              "(model.classifier_chunk_rows >= 0, now ",
              chunk_rows, "): the unfused loss takes the count as a value");
    return loss(forward(in, cp), labels, normalizer, valid_labels);
  }
  CPF_CHECK(normalizer >= 1, "GPT::forward_loss: normalizer=", normalizer,
            " must be at least 1 (the valid-label count)");
  const nn::ComputeCopiesScope copies = use_compute_copies();
  const Tensor x = hidden(in, cp);  // (T, C) in the compute dtype
  const profile::Scope scope("forward/loss", device());
  // The master weight (its gradient written in f32 by the op) with the step's cached copy in x's dtype when
  // one is held; without one the op casts the master itself.
  const Tensor master = lm_head_ ? lm_head_->weight() : embed_tokens_->weight();
  const Tensor copy = master.dtype() == x.dtype() ? Tensor() : nn::active_compute_copy(master, x.dtype());
  return classifier_loss(x, LinearWeights{master, Tensor(), copy, Tensor()}, labels,
                         {.normalizer = normalizer, .normalizer_tensor = normalizer_tensor, .chunk_rows = chunk_rows});
}

Tensor GPT::hidden(const GPTInput& in, const cp::ContextParallel* cp) const {
  CPF_CHECK(in.tokens.defined() && in.tokens.dim() == 1 && in.tokens.dtype() == DType::i64,
            "GPT: tokens must be a 1-D i64 tensor (THD storage order), got ",
            in.tokens.defined() ? in.tokens.shape() : Shape{}, in.tokens.defined() ? " " : "",
            in.tokens.defined() ? dtype_name(in.tokens.dtype()) : "undefined");
  const int64_t t = in.tokens.size(0);
  CPF_CHECK(in.positions.defined() && in.positions.shape() == Shape{t} && in.positions.dtype() == DType::i64,
            "GPT: positions must be i64 of the tokens' shape [", t, "], got ",
            in.positions.defined() ? in.positions.shape() : Shape{});
  const bool use_cp = cp != nullptr && cp->group != nullptr && cp->group->size() > 1;
  const int64_t cp_size = use_cp ? cp->group->size() : 1;
  CPF_CHECK(in.seq.q_storage_tokens() == t * cp_size, "GPT: the sequence info covers ", in.seq.q_storage_tokens(),
            " storage tokens but the batch has ", t, " tokens", use_cp ? " per rank x cp " : "",
            use_cp ? std::to_string(cp_size) : std::string());
  CPF_CHECK(in.tokens.device() == device() && in.positions.device() == device(), "GPT: tokens on ", in.tokens.device(),
            " and positions on ", in.positions.device(), " must be on the model's device ", device(),
            " (move the batch, e.g. models::to_device in models/gpt_input.h)");
  if (units_ != nullptr) units_->acquire(blocks_.size(), size_t{0});  // the root (kept), and block 0 ahead
  BlockOutput out{embed(in.tokens, in.positions), Tensor()};          // (T, C) stream, nothing pending yet
  for (size_t i = 0; i < blocks_.size(); ++i) out = run_block(i, out, in.seq, cp);
  return final_norm_fn_(out.x, out.pending, precision().compute).y;  // (T, C) in the compute dtype
}

BlockOutput GPT::run_block(size_t i, const BlockOutput& in, const SequenceInfo& seq,
                           const cp::ContextParallel* cp) const {
  const GPTBlock& block = *blocks_[i];
  const int64_t covered = options_.recompute_layers == 0 ? options_.num_layers : options_.recompute_layers;
  const std::optional<size_t> next = i + 1 < blocks_.size() ? std::optional<size_t>(i + 1) : std::nullopt;
  const std::optional<size_t> previous = i > 0 ? std::optional<size_t>(i - 1) : std::nullopt;
  const nn::ParameterUnits* units = units_;
  if (units != nullptr) units->acquire(i, next);
  const UnitHold held(units, i);
  // run.precision: fp8 runs the blocks' linear layers in FP8 (framework/autograd/fp8_autocast.h); the
  // embedding, the final norm and the LM head stay outside the scope.
  Fp8ScalingState* const fp8_state = fp8_scaling();  // delayed scaling: slots keyed "blocks.i.fp8_k"
  const std::string fp8_prefix = "blocks." + std::to_string(i);
  Fp8WeightCache* const fp8_copies = fp8_weight_cache();  // the step's FP8 weight copies, or null
  const bool in_fp8 =
      options_.fp8_linears && fp8_block(options_.fp8_scaling, static_cast<int64_t>(i), options_.num_layers);
  const Fp8LinearOptions fp8_options{.margin = options_.fp8_scaling.margin,
                                     .slot = std::nullopt,
                                     .weight_cache = fp8_copies,
                                     .fast_forward_accumulation = options_.fp8_scaling.fast_forward_accumulation,
                                     .fuse_activation_casts = options_.fp8_scaling.fuse_activation_casts};
  const Fp8Autocast fp8(in_fp8, fp8_options, fp8_state, fp8_prefix);
  if (options_.recompute == RecomputeMode::none || static_cast<int64_t>(i) >= covered || !grad_enabled()) {
    return block.forward(in.x, in.pending, seq, cp);
  }
  // The recompute runs inside the backward, on another call stack: it takes the same bf16 weight copies
  // and CP groups as this forward (captured here by value or by pointer to what outlives the step).
  const nn::ComputeCopies* copies = nn::active_compute_copies();
  std::optional<cp::ContextParallel> cp_copy;
  if (cp != nullptr) cp_copy = *cp;
  autograd::RegionFn fn = [&block, seq, cp_copy, copies, fp8 = in_fp8, fp8_options, fp8_state,
                           fp8_prefix](const std::vector<Tensor>& inputs) {
    const nn::ComputeCopiesScope scope(copies);
    // The recompute runs the GEMMs as the forward did, with the same slots (the keys count from 0 again) and
    // the FP8 weight copies the forward made.
    const Fp8Autocast fp8_scope(fp8, fp8_options, fp8_state, fp8_prefix);
    const BlockOutput out = block.forward(inputs[0], inputs[1], seq, cp_copy ? &*cp_copy : nullptr);
    return std::vector<Tensor>{out.x, out.pending};
  };
  const std::vector<Tensor> out = autograd::checkpoint(
      fn, {in.x, in.pending},
      {.name = "blocks." + std::to_string(i),
       .policy = options_.recompute == RecomputeMode::full ? autograd::RecomputePolicy::full
                                                           : autograd::RecomputePolicy::selective,
       .params = block.parameters(),
       .before_recompute = units ? std::function<void()>([units, i, previous] { units->acquire(i, previous); })
                                 : std::function<void()>(),
       .after_recompute = units ? std::function<void()>([units, i] { units->release(i); }) : std::function<void()>()});
  return {out[0], out[1]};
}

Fp8WeightCache* GPT::fp8_weight_cache() const {
  // Sharded parameters are whole only while their block runs: copies kept for the step would hold them all.
  const bool keep = options_.fp8_linears && options_.fp8_scaling.cache_weights && units_ == nullptr;
  return keep ? &fp8_weight_cache_ : nullptr;
}

Fp8ScalingState* GPT::fp8_scaling() const {
  if (!options_.fp8_linears || options_.fp8_scaling.recipe != Fp8Recipe::delayed) return nullptr;
  if (!fp8_scaling_) fp8_scaling_ = std::make_unique<Fp8ScalingState>(options_.fp8_scaling, device());
  return fp8_scaling_.get();
}

void GPT::set_parameter_units(const nn::ParameterUnits* units) {
  const int64_t covered = options_.recompute_layers == 0 ? options_.num_layers : options_.recompute_layers;
  CPF_CHECK(units == nullptr || (options_.recompute != RecomputeMode::none && covered == options_.num_layers),
            "GPT: sharded parameters (parallel.shard: parameters) need every block recomputed (model.recompute: ",
            "full or selective, model.recompute_layers: 0), got recompute: ",
            (options_.recompute == RecomputeMode::none ? "none" : "on"),
            ", recompute_layers: ", options_.recompute_layers, " of ", options_.num_layers,
            " layers: a block kept for the backward would hold its whole weights");
  units_ = units;
}

std::vector<std::vector<size_t>> GPT::parameter_units() const {
  std::vector<std::vector<size_t>> units(blocks_.size() + 1);
  const auto named = named_parameters();
  for (size_t k = 0; k < named.size(); ++k) {
    const std::string& name = named[k].first;
    size_t unit = blocks_.size();  // the root
    if (name.rfind("blocks.", 0) == 0) unit = std::stoul(name.substr(7, name.find('.', 7) - 7));
    units.at(unit).push_back(k);
  }
  return units;
}

Tensor GPT::embed(const Tensor& tokens, const Tensor& positions) const {
  const int64_t t = tokens.size(0);
  Tensor x = embed_tokens_->forward(tokens);  // (T, C) in the parameter dtype: the residual stream
  if (embed_positions_) {
    // Only padding can sit beyond the table (the config checks max_positions >= seq_len); its
    // embedding never reaches a loss or another token, so clamping it is harmless.
    Tensor clamped;  // (T) i64
    if (device().is_cpu()) {
      std::vector<int64_t> pos = positions.to_vector<int64_t>();
      for (int64_t& p : pos) {
        CPF_CHECK(p >= 0, "GPT: negative position ", p);
        p = std::min(p, options_.max_positions - 1);
      }
      clamped = from_vector(pos, {t});
    } else {
      // On a device: clamp there instead of reading the positions back (a host sync every step). The
      // embedding kernel still rejects negative ids.
      clamped = raw::binary(raw::BinaryOp::minimum, positions, static_cast<double>(options_.max_positions - 1));
    }
    x = add(x, embed_positions_->forward(clamped));
  }
  return x;
}

Tensor GPT::logits(const Tensor& x_in, const Tensor& pending) const {
  return head(final_norm_fn_(x_in, pending, precision().compute).y);  // the norm gives (T, C) in the compute dtype
}

Tensor GPT::head(const Tensor& x) const {
  if (lm_head_) return lm_head_->forward(x);  // (T, V)
  return linear(x, head_weight(x.dtype()));   // (T, V): the gradient of the table arrives (V, C), as the table is
}

Tensor GPT::head_weight(DType dtype) const {
  if (lm_head_) return nn::compute_parameter(lm_head_->weight(), dtype, "GPT", "lm_head");
  return nn::compute_parameter(embed_tokens_->weight(), dtype, "GPT", "tied embedding");
}

Tensor GPT::forward_cached(const Tensor& tokens, const nn::KVCacheStep& step, std::vector<nn::KVCache>& caches) const {
  step.check();
  CPF_CHECK(tokens.defined() && tokens.dim() == 1 && tokens.dtype() == DType::i64 && tokens.size(0) == step.total_new(),
            "GPT::forward_cached: tokens must be 1-D i64 with the step's ", step.total_new(), " new tokens, got ",
            tokens.defined() ? tokens.shape() : Shape{});
  CPF_CHECK(tokens.device() == device(), "GPT::forward_cached: tokens on ", tokens.device(),
            " must be on the model's device ", device());
  CPF_CHECK(caches.size() == blocks_.size(), "GPT::forward_cached: need one KVCache per block (", blocks_.size(),
            "), got ", caches.size());
  const nn::ComputeCopiesScope copies = use_compute_copies();
  BlockOutput out{embed(tokens, step.position_tensor(device())), Tensor()};
  for (size_t i = 0; i < blocks_.size(); ++i) out = blocks_[i]->forward_cached(out.x, out.pending, step, caches[i]);
  return logits(out.x, out.pending);
}

Tensor GPT::loss(const Tensor& logits, const Tensor& labels, int64_t normalizer, int64_t valid_labels) {
  const profile::Scope scope("forward/loss", logits.defined() ? logits.device() : Device::cpu());
  CPF_CHECK(normalizer >= 1, "GPT::loss: normalizer=", normalizer, " must be at least 1 (the valid-label count)");
  CPF_CHECK(labels.defined() && logits.defined() && labels.dim() == 1 && logits.dim() == 2 &&
                labels.size(0) == logits.size(0),
            "GPT::loss: labels (T) must match logits (T, V): labels=", labels.defined() ? labels.shape() : Shape{},
            " logits=", logits.defined() ? logits.shape() : Shape{});
  int64_t valid = valid_labels;
  if (valid < 0) {
    valid = 0;
    for (int64_t l : labels.to_vector<int64_t>()) valid += l != -100;
  }
  // cross_entropy is the mean over this rank's valid labels; rescale it to sum / normalizer.
  return mul(cross_entropy(logits, labels, -100), static_cast<double>(valid) / static_cast<double>(normalizer));
}

}  // namespace cpf::models
