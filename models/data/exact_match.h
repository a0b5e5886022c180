#pragma once
// Exact-match accuracy of a greedy next-token predictor on held-out synthetic examples.
//
// For each eval-split example the predictor sees the prompt ("12+345="), its prediction is appended and
// it is asked again, until it has produced as many tokens as the answer plus the end-of-text token.
// The example counts as correct when every produced token equals "357" + end-of-text; generation for
// an example stops at its first wrong token (the rest cannot make it correct).
//
//   auto predict = [&](const std::vector<int64_t>& prefix) { return argmax of the model's last logits; };
//   ExactMatchResult r = evaluate_exact_match(source, predict, 200);
//   log("accuracy ", r.accuracy());
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "models/data/deprecated_namespace.h"
#include "models/data/synthetic_tasks.h"

namespace cpf::models::data {

// The next token after `prefix` (greedy decoding).
using NextTokenFn = std::function<int64_t(const std::vector<int64_t>& prefix)>;
// One next token per prefix, for evaluating many examples per model call (prefixes differ in length).
using BatchNextTokenFn = std::function<std::vector<int64_t>(const std::vector<std::vector<int64_t>>& prefixes)>;

struct ExactMatchResult {
  int64_t num_examples = 0;
  int64_t num_correct = 0;
  // A few "prompt -> produced (expected ...)" lines for logs, failures first.
  std::vector<std::string> samples;
  double accuracy() const { return num_examples == 0 ? 0.0 : static_cast<double>(num_correct) / num_examples; }
};

// Eval-split examples first_example .. first_example + num_examples - 1.
ExactMatchResult evaluate_exact_match(const SyntheticSource& source, const NextTokenFn& predict, int64_t num_examples,
                                      int64_t first_example = 0);
// The same, asking `predict` for up to batch_size prefixes per call.
ExactMatchResult evaluate_exact_match_batched(const SyntheticSource& source, const BatchNextTokenFn& predict,
                                              int64_t num_examples, int64_t batch_size = 64, int64_t first_example = 0);

}  // namespace cpf::models::data
