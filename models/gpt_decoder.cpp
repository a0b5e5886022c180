#include "models/gpt_decoder.h"

#include <algorithm>
#include <cmath>

#include "attention/decode_attention.h"
#include "framework/autograd/grad_mode.h"
#include "framework/autograd/ops.h"
#include "framework/core/error.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/join.h"
#include "framework/tensor/ops/reduce.h"
#include "framework/tensor/ops/views.h"
#include "models/gpt_input.h"

namespace cpf::models {
namespace {

// (2, R) f64 of logits (R, V): each row's argmax (the lowest id among equal maxima) and max |logit|
// (inf or NaN exactly when a logit of the row is not finite).
Tensor greedy_picks(const Tensor& logits) {
  const Tensor ids = raw::to(raw::argmax(logits, -1), DType::f64);
  const Tensor top = raw::to(raw::amax(raw::unary(raw::UnaryOp::abs, logits), {-1}), DType::f64);
  return raw::stack({ids, top}, 0);
}

}  // namespace

int64_t decode_head_dim(const GPTOptions& o) {
  if (o.attention == AttentionType::mla) return o.kv_lora_rank + o.qk_rope_head_dim + (o.bias ? 1 : 0);
  return o.head_dim > 0 ? o.head_dim : o.hidden_size / o.num_heads;
}

GPTDecoder::GPTDecoder(const GPT& model, int64_t num_sequences, const GPTDecoderOptions& options)
    : model_(model), options_(options), num_sequences_(num_sequences) {
  CPF_CHECK(num_sequences >= 1, "GPTDecoder: num_sequences=", num_sequences, " must be at least 1");
  CPF_CHECK(options.context >= 1, "GPTDecoder: context=", options.context, " must be at least 1");
  CPF_CHECK(options.max_length >= 1, "GPTDecoder: max_length=", options.max_length, " must be at least 1");
  caches_.resize(static_cast<size_t>(model.options().num_layers));
  window_start_.assign(static_cast<size_t>(num_sequences), 0);
  cached_.assign(static_cast<size_t>(num_sequences), 0);
  seen_length_.assign(static_cast<size_t>(num_sequences), 0);
  const int64_t head_dim = decode_head_dim(model.options());
  const bool fits = model.device().is_cpu() || head_dim <= kDecodeAttentionMaxHeadDim;
  tables_usable_ = options.kv_cache && options.cuda_graph && fits;
  graph_usable_ = tables_usable_ && DeviceGraph::supported(model.device());
  if (!fits) {
    graph_note_ = "off (attention head dim " + std::to_string(head_dim) + " exceeds the decode kernel's " +
                  std::to_string(kDecodeAttentionMaxHeadDim) + "; decoding steps run eagerly)";
  } else if (!tables_usable_) {
    graph_note_ = "off (" + std::string(options.kv_cache ? "cuda_graph = false" : "no KV cache") + ")";
  } else if (!graph_usable_) {
    graph_note_ = "off (" + model.device().str() + " does not capture graphs; decoding steps run eagerly)";
  }
}

void GPTDecoder::check_call(const std::vector<std::vector<int64_t>>& sequences, const std::vector<bool>& active) const {
  CPF_CHECK(static_cast<int64_t>(sequences.size()) == num_sequences_ && active.size() == sequences.size(),
            "GPTDecoder: built for ", num_sequences_, " sequences, got ", sequences.size(), " sequences and ",
            active.size(), " active flags");
  CPF_CHECK(std::find(active.begin(), active.end(), true) != active.end(), "GPTDecoder: no sequence is active");
  for (size_t n = 0; n < sequences.size(); ++n) {
    const int64_t len = static_cast<int64_t>(sequences[n].size());
    CPF_CHECK(len >= seen_length_[n], "GPTDecoder: sequence ", n, " shrank from ", seen_length_[n], " to ", len,
              " tokens (sequences may only grow)");
    CPF_CHECK(!active[n] || (len >= 1 && len <= options_.max_length), "GPTDecoder: active sequence ", n, " has ", len,
              " tokens; expected 1 to max_length=", options_.max_length);
  }
}

void GPTDecoder::record_lengths(const std::vector<std::vector<int64_t>>& sequences) {
  for (size_t n = 0; n < sequences.size(); ++n) seen_length_[n] = static_cast<int64_t>(sequences[n].size());
}

Tensor GPTDecoder::next_logits(const std::vector<std::vector<int64_t>>& sequences, const std::vector<bool>& active) {
  check_call(sequences, active);
  NoGradGuard no_grad;
  Tensor rows = options_.kv_cache ? cached_logits(sequences, active) : full_window_logits(sequences, active);
  record_lengths(sequences);
  return rows;
}

GPTDecoder::GreedyPicks GPTDecoder::next_greedy(const std::vector<std::vector<int64_t>>& sequences,
                                                const std::vector<bool>& active) {
  check_call(sequences, active);
  NoGradGuard no_grad;
  Tensor picks;                 // (2, R): ids and max |logit| of R rows
  std::vector<int64_t> column;  // the column of each active sequence
  if (options_.kv_cache && is_decoding_step(sequences, active)) {
    picks = decoding_step(sequences, active, /*with_picks=*/true).picks;  // every sequence's column
    column = advance_decoded(active);
  } else {
    picks = greedy_picks(options_.kv_cache ? cached_logits(sequences, active) : full_window_logits(sequences, active));
    for (int64_t r = 0; r < static_cast<int64_t>(std::count(active.begin(), active.end(), true)); ++r)
      column.push_back(r);
  }
  record_lengths(sequences);
  const std::vector<double> host = raw::to(picks, Device::cpu()).to_vector<double>();  // the one read-back
  const size_t width = host.size() / 2;
  GreedyPicks out;
  for (int64_t c : column) {
    out.tokens.push_back(static_cast<int64_t>(host[static_cast<size_t>(c)]));
    out.finite.push_back(std::isfinite(host[width + static_cast<size_t>(c)]));
  }
  return out;
}

Tensor GPTDecoder::full_window_logits(const std::vector<std::vector<int64_t>>& sequences,
                                      const std::vector<bool>& active) {
  std::vector<std::vector<int64_t>> windows;
  for (size_t n = 0; n < sequences.size(); ++n) {
    if (!active[n]) continue;
    const auto& s = sequences[n];
    const int64_t start = std::max<int64_t>(0, static_cast<int64_t>(s.size()) - options_.context);
    windows.emplace_back(s.begin() + start, s.end());
    tokens_fed_ += static_cast<int64_t>(windows.back().size());
  }
  const Tensor logits = model_.forward(make_prompt_input(windows, model_.device()));  // (T, V)
  const std::vector<int64_t> last = last_token_rows(windows);
  return index_select(logits, 0, from_vector(last, {static_cast<int64_t>(last.size())}, model_.device()));
}

bool GPTDecoder::is_decoding_step(const std::vector<std::vector<int64_t>>& sequences,
                                  const std::vector<bool>& active) const {
  if (!tables_usable_) return false;
  const int64_t capacity = std::min(options_.context, options_.max_length);
  for (size_t n = 0; n < sequences.size(); ++n) {
    const int64_t len = static_cast<int64_t>(sequences[n].size());
    if (cached_[n] + 1 > capacity) return false;  // no free row (for a placeholder either)
    if (!active[n]) continue;
    // Exactly one token beyond the cached ones, in a window that does not slide.
    if (cached_[n] == 0 || len - window_start_[n] != cached_[n] + 1) return false;
  }
  return true;
}

GPTDecoder::StepOutputs GPTDecoder::decoding_step(const std::vector<std::vector<int64_t>>& sequences,
                                                  const std::vector<bool>& active, bool with_picks) {
  const int64_t seqs = num_sequences_, capacity = std::min(options_.context, options_.max_length);
  std::vector<int64_t> table(static_cast<size_t>(3 * seqs));  // tokens, positions, lengths
  nn::KVCacheStep step{.capacity = capacity, .past = cached_, .new_tokens = std::vector<int64_t>(cached_.size(), 1)};
  for (int64_t n = 0; n < seqs; ++n) {
    const auto i = static_cast<size_t>(n);
    table[i] = active[i] ? sequences[i].back() : 0;  // a placeholder token for a sequence sitting out
    table[i + seqs] = cached_[i];
    table[i + 2 * seqs] = cached_[i] + 1;
  }
  if (!step_buffer_.defined()) {
    step_buffer_ = empty({3, seqs}, {.dtype = DType::i64, .device = model_.device()});
    tables_.positions = raw::select(step_buffer_, 0, 1);
    tables_.lengths = raw::select(step_buffer_, 0, 2);
  }
  raw::copy_(step_buffer_, from_vector(table, {3, seqs}));  // one upload, outside any capture
  tables_.lengths_checked = false;  // the first layer checks the new lengths (in the graph: every replay)
  step.decode = &tables_;
  const Tensor tokens = raw::select(step_buffer_, 0, 0);
  const auto forward = [&](bool picks) {
    const Tensor logits = model_.forward_cached(tokens, step, caches_);  // (S, V)
    return StepOutputs{logits, picks ? greedy_picks(logits) : Tensor()};
  };
  if (graph_.defined()) {
    graph_.replay();
    ++graph_replays_;
    return graph_outputs_;
  }
  // The first step settles copies, plans and allocations; devices without graphs always run eagerly.
  if (!graph_usable_ || eager_decoding_steps_++ == 0) return forward(with_picks);
  try {  // the graph computes the greedy picks too (a few small kernels), for callers that want them
    graph_ = DeviceGraph::capture(model_.device(), [&] { graph_outputs_ = forward(true); });
  } catch (const Error& e) {
    graph_usable_ = false;
    graph_note_ = std::string("capture failed, decoding eagerly: ") + e.what();
    return forward(with_picks);
  }
  graph_.replay();
  ++graph_replays_;
  return graph_outputs_;
}

std::vector<int64_t> GPTDecoder::advance_decoded(const std::vector<bool>& active) {
  std::vector<int64_t> rows;
  for (size_t n = 0; n < active.size(); ++n) {
    if (!active[n]) continue;
    rows.push_back(static_cast<int64_t>(n));
    cached_[n] += 1;
  }
  tokens_fed_ += static_cast<int64_t>(rows.size());
  return rows;
}

Tensor GPTDecoder::cached_logits(const std::vector<std::vector<int64_t>>& sequences, const std::vector<bool>& active) {
  if (is_decoding_step(sequences, active)) {
    const Tensor logits = decoding_step(sequences, active, /*with_picks=*/false).logits;  // (S, V)
    const std::vector<int64_t> rows = advance_decoded(active);
    // A copy: the graph rewrites its logits at the next replay.
    if (static_cast<int64_t>(rows.size()) == num_sequences_) return raw::clone(logits);
    return index_select(logits, 0, from_vector(rows, {static_cast<int64_t>(rows.size())}, model_.device()));
  }
  nn::KVCacheStep step{.capacity = std::min(options_.context, options_.max_length), .past = {}, .new_tokens = {}};
  std::vector<int64_t> tokens, last_rows;
  for (size_t n = 0; n < sequences.size(); ++n) {
    const int64_t len = static_cast<int64_t>(sequences[n].size());
    int64_t fresh = 0;
    if (active[n]) {
      if (len - window_start_[n] > options_.context) {
        // The window slides: every position changes, so its cached keys are stale. Refeed the window.
        window_start_[n] = len - options_.context;
        cached_[n] = 0;
      }
      fresh = len - window_start_[n] - cached_[n];
      CPF_CHECK(fresh >= 1, "GPTDecoder: active sequence ", n, " has no token since the last call");
      const auto first = sequences[n].begin() + window_start_[n] + cached_[n];
      tokens.insert(tokens.end(), first, first + fresh);
      last_rows.push_back(static_cast<int64_t>(tokens.size()) - 1);
    }
    step.past.push_back(cached_[n]);
    step.new_tokens.push_back(fresh);
  }
  const Tensor input = from_vector(tokens, {static_cast<int64_t>(tokens.size())}, model_.device());
  const Tensor logits = model_.forward_cached(input, step, caches_);  // (T_new, V)
  for (size_t n = 0; n < sequences.size(); ++n) cached_[n] += step.new_tokens[n];
  tokens_fed_ += static_cast<int64_t>(tokens.size());
  return index_select(logits, 0, from_vector(last_rows, {static_cast<int64_t>(last_rows.size())}, model_.device()));
}

}  // namespace cpf::models
