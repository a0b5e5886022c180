#pragma once
// Text files as documents. By default byte-level: token = byte value (0..255), end-of-text = 256,
// vocabulary 257, and any file is valid input. With a tokenizer (data.tokenizer: gpt2 or a file,
// tokenizer.h) every document is encoded once, when the source is opened, as plain text (a literal
// "<|endoftext|>" in a file stays text); vocabulary and end-of-text are the tokenizer's.
//
// `path` is a file or a pattern (models/data/file_glob.h); files are read whole, in sorted order, and
// cut into documents by `text_split`:
//   blank_lines  a document is a run of non-blank lines (blank = only spaces, tabs, \r, \v, \f); the
//                newline after its last line is not part of it
//   separator    documents lie between occurrences of the exact string `text_separator`
//   file         one document per file
// Whitespace-only documents are dropped. A missing or empty file, or one that yields no document,
// is an error naming the path.
#include <memory>
#include <string>
#include <vector>

#include "models/data/deprecated_namespace.h"
#include "models/data/document_source.h"
#include "models/data/tokenizer.h"

namespace cpf::models::data {

enum class TextSplit { blank_lines, separator, file };

// "blank_lines" | "separator" | "file"; anything else throws listing the names.
TextSplit parse_text_split(const std::string& name);

struct TextOptions {
  std::string path;
  TextSplit split = TextSplit::blank_lines;
  std::string separator;                       // text_separator, used by TextSplit::separator
  std::shared_ptr<const Tokenizer> tokenizer;  // null or "bytes": byte-level
};

class TextSource : public DocumentSource {
 public:
  static constexpr int64_t kEndOfText = 256;
  static constexpr int64_t kVocabSize = 257;

  explicit TextSource(const TextOptions& options);

  const std::vector<std::string>& files() const { return files_; }
  // The bytes of document `index`, as text.
  std::string document_text(int64_t index) const;

  std::string name() const override { return "text"; }
  int64_t num_documents() const override { return static_cast<int64_t>(spans_.size()); }
  int64_t document_length(int64_t index) const override;
  Document document(int64_t index) const override;
  int64_t vocab_size() const override { return tokenizer_ ? tokenizer_->vocab_size() : kVocabSize; }
  int64_t eot_token() const override { return tokenizer_ ? tokenizer_->eot_token() : kEndOfText; }
  // Through the tokenizer; byte-level: bytes as characters, end-of-text as "<|endoftext|>".
  std::string decode(const std::vector<int64_t>& tokens) const override;

 private:
  struct Span {
    int64_t begin;
    int64_t length;
  };
  void add_file(const std::string& path, const TextOptions& options);
  void encode_documents();

  std::vector<std::string> files_;
  std::string bytes_;  // every file, concatenated
  std::vector<Span> spans_;
  std::shared_ptr<const Tokenizer> tokenizer_;  // null: byte-level
  std::vector<int32_t> token_ids_;              // with a tokenizer: every document's ids, concatenated
  std::vector<Span> token_spans_;               // document i's ids in token_ids_
};

}  // namespace cpf::models::data
