#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>

#include "models/data/exact_match.h"
#include "models/data/synthetic_tasks.h"
#include "support/test_utils.h"

namespace cpf::models::data {
namespace {

namespace v = synthetic_vocab;

// The answer (plus end-of-text) recomputed from the prompt tokens, independently of the library.
std::vector<int64_t> oracle_answer(SyntheticTask task, const std::vector<int64_t>& prompt) {
  std::vector<int64_t> out;
  if (task == SyntheticTask::addition) {
    int64_t a = 0, b = 0;
    int64_t* current = &a;
    for (int64_t t : prompt) {
      if (t == v::kPlus) {
        current = &b;
      } else if (t < 10) {
        *current = *current * 10 + t;
      }
    }
    for (char c : std::to_string(a + b)) out.push_back(c - '0');
  } else {
    std::vector<int64_t> items;
    for (int64_t t : prompt) {
      if (t < 10) items.push_back(t);
    }
    if (task == SyntheticTask::sort) std::sort(items.begin(), items.end());
    if (task == SyntheticTask::reverse) std::reverse(items.begin(), items.end());
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) out.push_back(v::kComma);
      out.push_back(items[i]);
    }
  }
  out.push_back(v::kEndOfText);
  return out;
}

std::vector<int64_t> prompt_of(const std::vector<int64_t>& prefix) {
  const auto eq = std::find(prefix.begin(), prefix.end(), v::kEquals);
  return std::vector<int64_t>(prefix.begin(), eq + 1);
}

SyntheticSource make_source(SyntheticTask task, int64_t min_len, int64_t max_len, uint64_t seed = 7) {
  return SyntheticSource({.task = task, .min_len = min_len, .max_len = max_len, .num_examples = 500, .seed = seed});
}

TEST(SyntheticVocab, EncodeDecodeRoundTrip) {
  EXPECT_EQ(synthetic_encode("12+3=15."), (std::vector<int64_t>{1, 2, 10, 3, 11, 1, 5, 13}));
  EXPECT_EQ(synthetic_decode(synthetic_encode("3,1,2=1,2,3.")), "3,1,2=1,2,3.");
  EXPECT_EQ(synthetic_decode({1, 99, -1}), "1<99><-1>");
  EXPECT_CPF_ERROR(synthetic_encode("1+x"), "character 'x' at 2 of \"1+x\" is not in the synthetic vocabulary");
  EXPECT_CPF_ERROR(parse_synthetic_task("multiply"), "unknown synthetic task 'multiply'");
}

TEST(SyntheticTasks, AdditionAnswersAreTheSumAndOperandsRespectTheDigitRange) {
  const SyntheticSource source = make_source(SyntheticTask::addition, 2, 4);
  std::set<size_t> digit_counts;
  for (int64_t i = 0; i < 300; ++i) {
    const SyntheticExample ex = source.example(i);
    std::vector<int64_t> expected = oracle_answer(SyntheticTask::addition, ex.prompt);
    expected.pop_back();
    EXPECT_EQ(ex.answer, expected) << synthetic_decode(ex.prompt);
    // Operands: 2..4 digits, no leading zero.
    const auto plus = std::find(ex.prompt.begin(), ex.prompt.end(), v::kPlus);
    const size_t a_digits = static_cast<size_t>(plus - ex.prompt.begin());
    const size_t b_digits = ex.prompt.size() - a_digits - 2;
    for (size_t d : {a_digits, b_digits}) {
      EXPECT_GE(d, 2u);
      EXPECT_LE(d, 4u);
      digit_counts.insert(d);
    }
    EXPECT_NE(ex.prompt.front(), 0);
    EXPECT_NE(*(plus + 1), 0);
    EXPECT_EQ(ex.prompt.back(), v::kEquals);
  }
  EXPECT_EQ(digit_counts, (std::set<size_t>{2, 3, 4}));
}

TEST(SyntheticTasks, ListTaskAnswersAreRecomputedFromThePrompt) {
  for (SyntheticTask task : {SyntheticTask::sort, SyntheticTask::copy, SyntheticTask::reverse}) {
    const SyntheticSource source = make_source(task, 3, 6);
    for (int64_t i = 0; i < 100; ++i) {
      const SyntheticExample ex = source.example(i);
      std::vector<int64_t> expected = oracle_answer(task, ex.prompt);
      expected.pop_back();
      EXPECT_EQ(ex.answer, expected) << synthetic_task_name(task) << ": " << synthetic_decode(ex.prompt);
      const size_t items = ex.prompt.size() / 2;  // "a,b,c=" has 2n tokens
      EXPECT_GE(items, 3u);
      EXPECT_LE(items, 6u);
    }
  }
}

TEST(SyntheticTasks, DocumentsMaskThePromptAndAreDeterministicBySeed) {
  const SyntheticSource a = make_source(SyntheticTask::addition, 1, 3, 11);
  const SyntheticSource b = make_source(SyntheticTask::addition, 1, 3, 11);
  const SyntheticSource c = make_source(SyntheticTask::addition, 1, 3, 12);
  int differ_seed = 0, differ_split = 0;
  for (int64_t i = 0; i < 50; ++i) {
    const Document doc = a.document(i);
    const SyntheticExample ex = a.example(i);
    EXPECT_EQ(doc.prompt_length, static_cast<int64_t>(ex.prompt.size()));
    EXPECT_EQ(a.document_length(i), static_cast<int64_t>(doc.tokens.size()));
    EXPECT_EQ(doc.tokens, b.document(i).tokens);
    differ_seed += doc.tokens != c.document(i).tokens;
    differ_split += ex.prompt != a.example(i, Split::eval).prompt;
  }
  EXPECT_GT(differ_seed, 40);
  EXPECT_GT(differ_split, 40);
  EXPECT_EQ(a.name(), "synthetic:addition");
  EXPECT_EQ(a.vocab_size(), 14);
  EXPECT_EQ(a.eot_token(), 13);
}

TEST(SyntheticTasks, RejectsInvalidOptionsAndIndices) {
  EXPECT_CPF_ERROR(make_source(SyntheticTask::sort, 0, 3), "needs 1 <= min_len <= max_len, got min_len=0 max_len=3");
  EXPECT_CPF_ERROR(make_source(SyntheticTask::sort, 4, 3), "got min_len=4 max_len=3");
  EXPECT_CPF_ERROR(make_source(SyntheticTask::addition, 1, 19), "max_len=19 digits overflow int64");
  EXPECT_CPF_ERROR(SyntheticSource({.num_examples = 0}), "num_examples=0 must be at least 1");
  const SyntheticSource source = make_source(SyntheticTask::copy, 1, 2);
  EXPECT_CPF_ERROR(source.example(500), "train example 500 is outside [0, num_examples=500)");
  EXPECT_CPF_ERROR(source.example(-1, Split::eval), "example index -1 is negative");
  EXPECT_CPF_ERROR(source.document(500), "synthetic:copy: document index 500 is outside [0, 500)");
}

TEST(ExactMatch, OracleScoresAllAndWrongPredictorScoresNothing) {
  for (SyntheticTask task : {SyntheticTask::addition, SyntheticTask::sort, SyntheticTask::reverse}) {
    const SyntheticSource source = make_source(task, 1, 4);
    const NextTokenFn oracle = [&](const std::vector<int64_t>& prefix) {
      const std::vector<int64_t> prompt = prompt_of(prefix);
      return oracle_answer(task, prompt)[prefix.size() - prompt.size()];
    };
    const ExactMatchResult perfect = evaluate_exact_match(source, oracle, 40);
    EXPECT_EQ(perfect.num_examples, 40);
    EXPECT_EQ(perfect.num_correct, 40);
    EXPECT_DOUBLE_EQ(perfect.accuracy(), 1.0);
    ASSERT_FALSE(perfect.samples.empty());
    EXPECT_NE(perfect.samples.front().find("(correct"), std::string::npos) << perfect.samples.front();

    // Right answer, but never stops: the missing end-of-text makes every example wrong.
    const NextTokenFn no_stop = [&](const std::vector<int64_t>& prefix) {
      const int64_t t = oracle(prefix);
      return t == v::kEndOfText ? int64_t{v::kComma} : t;
    };
    const ExactMatchResult wrong = evaluate_exact_match(source, no_stop, 40);
    EXPECT_EQ(wrong.num_correct, 0);
    EXPECT_DOUBLE_EQ(wrong.accuracy(), 0.0);
    EXPECT_NE(wrong.samples.front().find("(expected"), std::string::npos) << wrong.samples.front();
  }
}

TEST(ExactMatch, BatchedEvaluationMatchesAndCountsPartialSuccess) {
  const SyntheticSource source = make_source(SyntheticTask::addition, 1, 2);
  // Correct only on examples whose first prompt digit is even.
  auto predict_one = [&](const std::vector<int64_t>& prefix) {
    const std::vector<int64_t> prompt = prompt_of(prefix);
    const int64_t t = oracle_answer(SyntheticTask::addition, prompt)[prefix.size() - prompt.size()];
    return prompt.front() % 2 == 0 ? t : (t + 1) % v::kSize;
  };
  int64_t expected = 0;
  for (int64_t i = 0; i < 64; ++i) expected += source.example(i, Split::eval).prompt.front() % 2 == 0;
  const ExactMatchResult single = evaluate_exact_match(source, predict_one, 64);
  int64_t calls = 0;
  const BatchNextTokenFn predict_many = [&](const std::vector<std::vector<int64_t>>& prefixes) {
    ++calls;
    EXPECT_LE(prefixes.size(), 16u);
    std::vector<int64_t> next;
    for (const auto& p : prefixes) next.push_back(predict_one(p));
    return next;
  };
  const ExactMatchResult batched = evaluate_exact_match_batched(source, predict_many, 64, 16);
  EXPECT_EQ(single.num_correct, expected);
  EXPECT_EQ(batched.num_correct, expected);
  EXPECT_GT(expected, 0);
  EXPECT_LT(expected, 64);
  EXPECT_LE(calls, 4 * 4);  // 4 groups of 16, at most 3 answer digits + end-of-text each
}

TEST(ExactMatch, RejectsBadArguments) {
  const SyntheticSource source = make_source(SyntheticTask::copy, 1, 2);
  const NextTokenFn zero = [](const std::vector<int64_t>&) { return int64_t{0}; };
  EXPECT_CPF_ERROR(evaluate_exact_match(source, zero, 0), "num_examples=0 must be at least 1");
  EXPECT_CPF_ERROR(evaluate_exact_match(source, zero, 3, -2), "first_example=-2 is negative");
  EXPECT_CPF_ERROR(evaluate_exact_match(source, NextTokenFn(), 3), "the predictor is empty");
  const BatchNextTokenFn short_answer = [](const std::vector<std::vector<int64_t>>&) { return std::vector<int64_t>{}; };
  EXPECT_CPF_ERROR(evaluate_exact_match_batched(source, short_answer, 3, 2), "returned 0 tokens for 2 prefixes");
  EXPECT_CPF_ERROR(evaluate_exact_match_batched(source, short_answer, 3, 0), "batch_size=0 must be at least 1");
}

}  // namespace
}  // namespace cpf::models::data
