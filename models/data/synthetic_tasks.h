#pragma once
// Synthetic tasks whose learning is measurable: every example is a question and an exactly checkable
// answer, so a trainer can report exact-match accuracy next to the loss.
//
//   addition   "12+345=357"          operands of min_len..max_len digits (uniform digit count, then
//                                    a uniform number of that many digits), answer = their sum
//   sort       "3,1,2,1=1,1,2,3"     min_len..max_len items of one digit, answer = sorted ascending
//   copy       "3,1,2=3,1,2"         answer = the list
//   reverse    "3,1,2=2,1,3"         answer = the list reversed
//
// Vocabulary (14 tokens):   0..9 the digits   10 '+'   11 '='   12 ','   13 end-of-text ('.' in text)
//
// Each example is one document whose prompt is everything up to and including '='; only the answer
// tokens and the closing end-of-text are training targets. Example i is a pure function of
// (seed, split, i) through Philox (models/data/data_order.h), so the training set needs no storage.
// The eval split draws from an independent stream; with few digits the two splits can share
// problems (there are only 100 * 100 two-digit additions).
#include <cstdint>
#include <string>
#include <vector>

#include "models/data/deprecated_namespace.h"
#include "models/data/document_source.h"

namespace cpf::models::data {

namespace synthetic_vocab {
constexpr int64_t kPlus = 10;
constexpr int64_t kEquals = 11;
constexpr int64_t kComma = 12;
constexpr int64_t kEndOfText = 13;
constexpr int64_t kSize = 14;
}  // namespace synthetic_vocab

enum class SyntheticTask { addition, sort, copy, reverse };
enum class Split { train, eval };

// "addition" | "sort" | "copy" | "reverse"; anything else throws listing the names.
SyntheticTask parse_synthetic_task(const std::string& name);
std::string synthetic_task_name(SyntheticTask task);

// Text <-> tokens with the table above: "12+3=15." <-> {1,2,10,3,11,1,5,13}. Unknown characters throw.
std::vector<int64_t> synthetic_encode(const std::string& text);
std::string synthetic_decode(const std::vector<int64_t>& tokens);

struct SyntheticExample {
  std::vector<int64_t> prompt;  // question, ends with '='
  std::vector<int64_t> answer;  // without the end-of-text token
};

struct SyntheticOptions {
  SyntheticTask task = SyntheticTask::addition;
  int64_t min_len = 1;  // addition: digits per operand; list tasks: items
  int64_t max_len = 3;
  int64_t num_examples = 100000;  // documents per epoch of the train split
  uint64_t seed = 1234;
};

class SyntheticSource : public DocumentSource {
 public:
  static constexpr int64_t kMaxAdditionDigits = 18;  // the sum stays below 2^63

  explicit SyntheticSource(const SyntheticOptions& options);

  // Example `index` of a split; train indices lie in [0, num_examples), eval indices are unbounded.
  SyntheticExample example(int64_t index, Split split = Split::train) const;
  const SyntheticOptions& options() const { return options_; }

  std::string name() const override;
  int64_t num_documents() const override { return options_.num_examples; }
  int64_t document_length(int64_t index) const override;
  Document document(int64_t index) const override;
  int64_t vocab_size() const override { return synthetic_vocab::kSize; }
  int64_t eot_token() const override { return synthetic_vocab::kEndOfText; }
  std::string decode(const std::vector<int64_t>& tokens) const override { return synthetic_decode(tokens); }

 private:
  SyntheticOptions options_;
};

}  // namespace cpf::models::data
