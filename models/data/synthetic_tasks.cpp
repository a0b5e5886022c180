#include "models/data/synthetic_tasks.h"

#include <algorithm>

#include "models/data/data_order.h"

namespace cpf::models::data {
namespace {

// Successive uniform draws for one example: draw j uses Philox counter (index, j).
class ExampleRng {
 public:
  ExampleRng(uint64_t seed, Split split, int64_t index)
      : seed_(seed),
        domain_(split == Split::train ? RandomDomain::train_examples : RandomDomain::eval_examples),
        index_(static_cast<uint64_t>(index)) {}
  int64_t below(int64_t n) { return uniform_below(philox_bits(seed_, domain_, index_, draw_++), n); }
  int64_t between(int64_t low, int64_t high) { return low + below(high - low + 1); }  // [low, high]

 private:
  uint64_t seed_;
  RandomDomain domain_;
  uint64_t index_;
  uint32_t draw_ = 0;
};

int64_t pow10(int64_t digits) {
  int64_t value = 1;
  for (int64_t i = 0; i < digits; ++i) value *= 10;
  return value;
}

// A uniform number with exactly `digits` digits (0..9 for one digit: no leading zeros otherwise).
int64_t random_number(ExampleRng& rng, int64_t digits) {
  if (digits == 1) return rng.below(10);
  return pow10(digits - 1) + rng.below(9 * pow10(digits - 1));
}

void append_number(std::vector<int64_t>& out, int64_t value) {
  const std::string text = std::to_string(value);
  for (char c : text) out.push_back(c - '0');
}

void append_list(std::vector<int64_t>& out, const std::vector<int64_t>& items) {
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out.push_back(synthetic_vocab::kComma);
    out.push_back(items[i]);
  }
}

}  // namespace

SyntheticTask parse_synthetic_task(const std::string& name) {
  if (name == "addition") return SyntheticTask::addition;
  if (name == "sort") return SyntheticTask::sort;
  if (name == "copy") return SyntheticTask::copy;
  if (name == "reverse") return SyntheticTask::reverse;
  CPF_FAIL("data: unknown synthetic task '", name, "' (task: addition | sort | copy | reverse)");
}

std::string synthetic_task_name(SyntheticTask task) {
  switch (task) {
    case SyntheticTask::addition: return "addition";
    case SyntheticTask::sort: return "sort";
    case SyntheticTask::copy: return "copy";
    case SyntheticTask::reverse: return "reverse";
  }
  CPF_FAIL("synthetic_task_name: invalid task ", static_cast<int>(task));
}

std::vector<int64_t> synthetic_encode(const std::string& text) {
  std::vector<int64_t> tokens;
  tokens.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c >= '0' && c <= '9') {
      tokens.push_back(c - '0');
    } else if (c == '+') {
      tokens.push_back(synthetic_vocab::kPlus);
    } else if (c == '=') {
      tokens.push_back(synthetic_vocab::kEquals);
    } else if (c == ',') {
      tokens.push_back(synthetic_vocab::kComma);
    } else if (c == '.') {
      tokens.push_back(synthetic_vocab::kEndOfText);
    } else {
      CPF_FAIL("synthetic_encode: character '", c, "' at ", i, " of \"", text,
               "\" is not in the synthetic vocabulary (digits, '+', '=', ',', '.')");
    }
  }
  return tokens;
}

std::string synthetic_decode(const std::vector<int64_t>& tokens) {
  static const char kChars[] = "0123456789+=,.";
  std::string text;
  for (int64_t t : tokens) {
    if (t >= 0 && t < synthetic_vocab::kSize) {
      text.push_back(kChars[t]);
    } else {
      append_token_id(text, t);
    }
  }
  return text;
}

SyntheticSource::SyntheticSource(const SyntheticOptions& options) : options_(options) {
  const std::string task = synthetic_task_name(options.task);
  CPF_CHECK(options.min_len >= 1 && options.max_len >= options.min_len, "data: synthetic task ", task,
            " needs 1 <= min_len <= max_len, got min_len=", options.min_len, " max_len=", options.max_len);
  CPF_CHECK(options.task != SyntheticTask::addition || options.max_len <= kMaxAdditionDigits,
            "data: addition operands of max_len=", options.max_len, " digits overflow int64; use at most ",
            kMaxAdditionDigits);
  CPF_CHECK(options.num_examples >= 1, "data: num_examples=", options.num_examples, " must be at least 1");
}

std::string SyntheticSource::name() const { return "synthetic:" + synthetic_task_name(options_.task); }

SyntheticExample SyntheticSource::example(int64_t index, Split split) const {
  CPF_CHECK(index >= 0, name(), ": example index ", index, " is negative");
  CPF_CHECK(split == Split::eval || index < options_.num_examples, name(), ": train example ", index,
            " is outside [0, num_examples=", options_.num_examples, ")");
  ExampleRng rng(options_.seed, split, index);
  SyntheticExample ex;
  if (options_.task == SyntheticTask::addition) {
    const int64_t a = random_number(rng, rng.between(options_.min_len, options_.max_len));
    const int64_t b = random_number(rng, rng.between(options_.min_len, options_.max_len));
    append_number(ex.prompt, a);
    ex.prompt.push_back(synthetic_vocab::kPlus);
    append_number(ex.prompt, b);
    append_number(ex.answer, a + b);
  } else {
    std::vector<int64_t> items(static_cast<size_t>(rng.between(options_.min_len, options_.max_len)));
    for (int64_t& item : items) item = rng.below(10);
    append_list(ex.prompt, items);
    if (options_.task == SyntheticTask::sort) std::sort(items.begin(), items.end());
    if (options_.task == SyntheticTask::reverse) std::reverse(items.begin(), items.end());
    append_list(ex.answer, items);
  }
  ex.prompt.push_back(synthetic_vocab::kEquals);
  return ex;
}

int64_t SyntheticSource::document_length(int64_t index) const {
  check_document_index(*this, index);
  const SyntheticExample ex = example(index);
  return static_cast<int64_t>(ex.prompt.size() + ex.answer.size());
}

Document SyntheticSource::document(int64_t index) const {
  check_document_index(*this, index);
  SyntheticExample ex = example(index);
  Document doc;
  doc.prompt_length = static_cast<int64_t>(ex.prompt.size());
  doc.tokens = std::move(ex.prompt);
  doc.tokens.insert(doc.tokens.end(), ex.answer.begin(), ex.answer.end());
  return doc;
}

}  // namespace cpf::models::data
