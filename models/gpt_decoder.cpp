#include "models/gpt_decoder.h"

#include <algorithm>

#include "framework/autograd/grad_mode.h"
#include "framework/autograd/ops.h"
#include "models/gpt_input.h"

namespace cpf::models {

GPTDecoder::GPTDecoder(const GPT& model, int64_t num_sequences, const GPTDecoderOptions& options)
    : model_(model), options_(options), num_sequences_(num_sequences) {
  CPF_CHECK(num_sequences >= 1, "GPTDecoder: num_sequences=", num_sequences, " must be at least 1");
  CPF_CHECK(options.context >= 1, "GPTDecoder: context=", options.context, " must be at least 1");
  CPF_CHECK(options.max_length >= 1, "GPTDecoder: max_length=", options.max_length, " must be at least 1");
  caches_.resize(static_cast<size_t>(model.options().num_layers));
  window_start_.assign(static_cast<size_t>(num_sequences), 0);
  cached_.assign(static_cast<size_t>(num_sequences), 0);
  seen_length_.assign(static_cast<size_t>(num_sequences), 0);
}

Tensor GPTDecoder::next_logits(const std::vector<std::vector<int64_t>>& sequences, const std::vector<bool>& active) {
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
  NoGradGuard no_grad;
  Tensor rows = options_.kv_cache ? cached_logits(sequences, active) : full_window_logits(sequences, active);
  for (size_t n = 0; n < sequences.size(); ++n) seen_length_[n] = static_cast<int64_t>(sequences[n].size());
  return rows;
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

Tensor GPTDecoder::cached_logits(const std::vector<std::vector<int64_t>>& sequences, const std::vector<bool>& active) {
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
