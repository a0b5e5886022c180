#pragma once
// GPTDecoder: next-token logits for a batch of growing token sequences, the loop of `cpformer
// generate` (and of any sampling code built on the library).
//
// The model sees at most `context` tokens of each sequence (the training seq_len): the last `context`
// tokens at positions 0 .. context-1, as in training. Two ways to get there, with the same result:
//
//   kv_cache = false   every call runs the full forward over each sequence's window
//   kv_cache = true    each layer keeps the keys/values of the tokens already seen
//                      (attention/modules/kv_cache.h), so a call feeds only the tokens added since the
//                      last one. Once a sequence outgrows `context` its window slides and every position
//                      changes, so from then on each of its calls refeeds its window (as the full
//                      forward does); until then decoding a token costs one token's forward.
//
// Sequences decode together: those with no new tokens since the last call (finished ones) sit it out.
#include <cstdint>
#include <vector>

#include "attention/modules/kv_cache.h"
#include "models/gpt.h"

namespace cpf::models {

struct GPTDecoderOptions {
  int64_t context = 0;     // tokens of each sequence the model sees at most (>= 1)
  int64_t max_length = 0;  // longest sequence that will be passed (sizes the cache: min(context, max_length))
  bool kv_cache = true;
};

class GPTDecoder {
 public:
  // `model` must outlive the decoder; it is used on its device, in eval mode, under NoGradGuard.
  GPTDecoder(const GPT& model, int64_t num_sequences, const GPTDecoderOptions& options);

  // Next-token logits (A, vocab_size), one row per active sequence in order, for `sequences` (each
  // sequence's whole history; it may only grow between calls, and active ones must be non-empty and no
  // longer than max_length). Rows are in the model's compute dtype on its device.
  Tensor next_logits(const std::vector<std::vector<int64_t>>& sequences, const std::vector<bool>& active);

  // Tokens fed to the model so far (prompt and decoded tokens, refed windows included): the work done.
  int64_t tokens_fed() const { return tokens_fed_; }

 private:
  Tensor full_window_logits(const std::vector<std::vector<int64_t>>& sequences, const std::vector<bool>& active);
  Tensor cached_logits(const std::vector<std::vector<int64_t>>& sequences, const std::vector<bool>& active);

  const GPT& model_;
  GPTDecoderOptions options_;
  int64_t num_sequences_ = 0;
  std::vector<nn::KVCache> caches_;    // one per block
  std::vector<int64_t> window_start_;  // per sequence: index of its window's first token
  std::vector<int64_t> cached_;        // per sequence: tokens of its window already in the cache
  std::vector<int64_t> seen_length_;   // per sequence: its length at the last call
  int64_t tokens_fed_ = 0;
};

}  // namespace cpf::models
