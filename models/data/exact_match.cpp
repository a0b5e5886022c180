#include "models/data/exact_match.h"

#include <algorithm>

namespace cpf::models::data {
namespace {

constexpr size_t kMaxSamples = 4;

struct Pending {
  std::vector<int64_t> prefix;    // prompt + tokens produced so far
  std::vector<int64_t> expected;  // answer + end-of-text
  size_t prompt_size = 0;
  bool failed = false;
  bool done() const { return failed || prefix.size() - prompt_size == expected.size(); }
};

void check_counts(int64_t num_examples, int64_t first_example, int64_t batch_size) {
  CPF_CHECK(num_examples >= 1, "evaluate_exact_match: num_examples=", num_examples, " must be at least 1");
  CPF_CHECK(first_example >= 0, "evaluate_exact_match: first_example=", first_example, " is negative");
  CPF_CHECK(batch_size >= 1, "evaluate_exact_match: batch_size=", batch_size, " must be at least 1");
}

std::string sample_line(const SyntheticSource& source, const Pending& p) {
  const std::vector<int64_t> prompt(p.prefix.begin(), p.prefix.begin() + static_cast<int64_t>(p.prompt_size));
  const std::vector<int64_t> produced(p.prefix.begin() + static_cast<int64_t>(p.prompt_size), p.prefix.end());
  return source.decode(prompt) + " -> " + source.decode(produced) + (p.failed ? " (expected " : " (correct ") +
         source.decode(p.expected) + ")";
}

}  // namespace

ExactMatchResult evaluate_exact_match_batched(const SyntheticSource& source, const BatchNextTokenFn& predict,
                                              int64_t num_examples, int64_t batch_size, int64_t first_example) {
  check_counts(num_examples, first_example, batch_size);
  CPF_CHECK(static_cast<bool>(predict), "evaluate_exact_match: the predictor is empty");
  ExactMatchResult result;
  std::vector<std::string> failures, successes;
  for (int64_t start = 0; start < num_examples; start += batch_size) {
    const int64_t count = std::min(batch_size, num_examples - start);
    std::vector<Pending> group(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) {
      SyntheticExample ex = source.example(first_example + start + i, Split::eval);
      Pending& p = group[static_cast<size_t>(i)];
      p.prompt_size = ex.prompt.size();
      p.prefix = std::move(ex.prompt);
      p.expected = std::move(ex.answer);
      p.expected.push_back(source.eot_token());
    }
    while (true) {
      std::vector<size_t> active;
      std::vector<std::vector<int64_t>> prefixes;
      for (size_t i = 0; i < group.size(); ++i) {
        if (group[i].done()) continue;
        active.push_back(i);
        prefixes.push_back(group[i].prefix);
      }
      if (active.empty()) break;
      const std::vector<int64_t> next = predict(prefixes);
      CPF_CHECK(next.size() == active.size(), "evaluate_exact_match: the predictor returned ", next.size(),
                " tokens for ", active.size(), " prefixes");
      for (size_t k = 0; k < active.size(); ++k) {
        Pending& p = group[active[k]];
        const size_t produced = p.prefix.size() - p.prompt_size;
        p.prefix.push_back(next[k]);
        if (next[k] != p.expected[produced]) p.failed = true;
      }
    }
    for (const Pending& p : group) {
      result.num_examples += 1;
      result.num_correct += p.failed ? 0 : 1;
      std::vector<std::string>& bucket = p.failed ? failures : successes;
      if (bucket.size() < kMaxSamples) bucket.push_back(sample_line(source, p));
    }
  }
  for (auto* bucket : {&failures, &successes}) {
    for (const std::string& line : *bucket) {
      if (result.samples.size() < kMaxSamples) result.samples.push_back(line);
    }
  }
  return result;
}

ExactMatchResult evaluate_exact_match(const SyntheticSource& source, const NextTokenFn& predict, int64_t num_examples,
                                      int64_t first_example) {
  CPF_CHECK(static_cast<bool>(predict), "evaluate_exact_match: the predictor is empty");
  const BatchNextTokenFn one_by_one = [&](const std::vector<std::vector<int64_t>>& prefixes) {
    std::vector<int64_t> next;
    next.reserve(prefixes.size());
    for (const auto& prefix : prefixes) next.push_back(predict(prefix));
    return next;
  };
  return evaluate_exact_match_batched(source, one_by_one, num_examples, 1, first_example);
}

}  // namespace cpf::models::data
