#pragma once
// Next-token sampling for `cpformer generate`: temperature, top-k and top-p (nucleus) filtering.
//
// From one row of logits: greedy (temperature 0) takes the most likely token (the lowest id among
// equal maxima). Otherwise p = softmax(logits / temperature); top_k > 0 keeps the k most likely
// tokens (ties broken by lower id; k >= vocabulary keeps all); top_p < 1 then keeps the smallest set
// of the most likely tokens whose probability sums to at least top_p (always at least one); the kept
// probabilities are renormalised and one token is drawn with a uniform number from the generator.
// The order (temperature, top-k, top-p) is Hugging Face's.
#include <cstdint>
#include <vector>

#include "framework/core/generator.h"

namespace cpf::trainer {

struct SamplingOptions {
  double temperature = 0.0;  // 0 = greedy
  int64_t top_k = 0;         // 0 = no top-k filter
  double top_p = 1.0;        // 1 = no nucleus filter
};

// Throws cpf::Error naming the option and the fix: temperature not finite or < 0, top_k < 0, top_p
// outside (0, 1], or a filter with temperature 0 (greedy ignores filters, so it would be silently lost).
void check_sampling_options(const SamplingOptions& options);

// The distribution a token is drawn from (sums to 1; zeros for filtered tokens). Greedy: one-hot.
std::vector<double> sampling_distribution(const std::vector<double>& logits, const SamplingOptions& options);

// One token id drawn from sampling_distribution (greedy draws no number from `gen`).
int64_t sample_token(const std::vector<double>& logits, const SamplingOptions& options, Generator& gen);

}  // namespace cpf::trainer
