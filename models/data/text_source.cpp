#include "models/data/text_source.h"

#include <fstream>
#include <iterator>
#include <sstream>

#include "models/data/file_glob.h"

namespace cpf::models::data {
namespace {

bool is_blank_char(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

bool is_whitespace(std::string_view text) {
  for (char c : text) {
    if (!is_blank_char(c) && c != '\n') return false;
  }
  return true;
}

const char* split_name(TextSplit split) {
  switch (split) {
    case TextSplit::blank_lines: return "blank_lines";
    case TextSplit::separator: return "separator";
    case TextSplit::file: return "file";
  }
  return "?";
}

}  // namespace

TextSplit parse_text_split(const std::string& name) {
  if (name == "blank_lines") return TextSplit::blank_lines;
  if (name == "separator") return TextSplit::separator;
  if (name == "file") return TextSplit::file;
  CPF_FAIL("data: unknown text_split '", name, "' (text_split: blank_lines | separator | file)");
}

TextSource::TextSource(const TextOptions& options) {
  CPF_CHECK(options.split != TextSplit::separator || !options.separator.empty(),
            "text source: text_split is 'separator' but text_separator is empty");
  files_ = expand_file_pattern(options.path, "text source");
  for (const std::string& file : files_) add_file(file, options);
  if (options.tokenizer && options.tokenizer->name() != "bytes") {
    tokenizer_ = options.tokenizer;
    encode_documents();
  }
}

void TextSource::encode_documents() {
  CPF_CHECK(tokenizer_->vocab_size() <= (int64_t{1} << 31), "text source: tokenizer ", tokenizer_->name(), " has ",
            tokenizer_->vocab_size(), " tokens, more than int32 ids hold");
  for (int64_t i = 0; i < num_documents(); ++i) {
    const Span& span = spans_[static_cast<size_t>(i)];
    const std::vector<int64_t> ids = tokenizer_->encode(
        std::string_view(bytes_).substr(static_cast<size_t>(span.begin), static_cast<size_t>(span.length)));
    token_spans_.push_back({static_cast<int64_t>(token_ids_.size()), static_cast<int64_t>(ids.size())});
    token_ids_.insert(token_ids_.end(), ids.begin(), ids.end());
  }
}

void TextSource::add_file(const std::string& path, const TextOptions& options) {
  std::ifstream in(path, std::ios::binary);
  CPF_CHECK(in.good(), "text source: cannot open file '", path, "'");
  std::ostringstream content;
  content << in.rdbuf();
  const std::string text = content.str();
  CPF_CHECK(!text.empty(), "text source: file '", path, "' is empty");

  const int64_t base = static_cast<int64_t>(bytes_.size());
  const size_t documents_before = spans_.size();
  bytes_ += text;
  // Adds [begin, end) of this file unless it is only whitespace.
  auto add_span = [&](size_t begin, size_t end) {
    if (end > begin && !is_whitespace(std::string_view(text).substr(begin, end - begin))) {
      spans_.push_back({base + static_cast<int64_t>(begin), static_cast<int64_t>(end - begin)});
    }
  };
  if (options.split == TextSplit::file) {
    add_span(0, text.size());
  } else if (options.split == TextSplit::separator) {
    size_t begin = 0;
    while (true) {
      const size_t at = text.find(options.separator, begin);
      add_span(begin, at == std::string::npos ? text.size() : at);
      if (at == std::string::npos) break;
      begin = at + options.separator.size();
    }
  } else {
    // Lines are [line_begin, line_end) without their '\n'; a document spans its non-blank lines.
    size_t doc_begin = std::string::npos, doc_end = 0, line_begin = 0;
    while (line_begin <= text.size()) {
      size_t line_end = text.find('\n', line_begin);
      if (line_end == std::string::npos) line_end = text.size();
      const bool blank = is_whitespace(std::string_view(text).substr(line_begin, line_end - line_begin));
      if (!blank) {
        if (doc_begin == std::string::npos) doc_begin = line_begin;
        doc_end = line_end;
      } else if (doc_begin != std::string::npos) {
        add_span(doc_begin, doc_end);
        doc_begin = std::string::npos;
      }
      line_begin = line_end + 1;
    }
    if (doc_begin != std::string::npos) add_span(doc_begin, doc_end);
  }
  CPF_CHECK(spans_.size() > documents_before, "text source: file '", path,
            "' holds no document (text_split: ", split_name(options.split), "; it is only whitespace)");
}

std::string TextSource::document_text(int64_t index) const {
  check_document_index(*this, index);
  const Span& span = spans_[static_cast<size_t>(index)];
  return bytes_.substr(static_cast<size_t>(span.begin), static_cast<size_t>(span.length));
}

int64_t TextSource::document_length(int64_t index) const {
  check_document_index(*this, index);
  return (tokenizer_ ? token_spans_ : spans_)[static_cast<size_t>(index)].length;
}

Document TextSource::document(int64_t index) const {
  check_document_index(*this, index);
  if (tokenizer_) {
    const Span& span = token_spans_[static_cast<size_t>(index)];
    Document doc;
    doc.tokens.assign(token_ids_.begin() + span.begin, token_ids_.begin() + span.begin + span.length);
    return doc;
  }
  const Span& span = spans_[static_cast<size_t>(index)];
  Document doc;
  doc.tokens.reserve(static_cast<size_t>(span.length));
  for (int64_t i = 0; i < span.length; ++i) {
    doc.tokens.push_back(static_cast<unsigned char>(bytes_[static_cast<size_t>(span.begin + i)]));
  }
  return doc;
}

std::string TextSource::decode(const std::vector<int64_t>& tokens) const {
  if (tokenizer_) return tokenizer_->decode(tokens);
  std::string text;
  for (int64_t t : tokens) {
    if (t >= 0 && t < 256) {
      text.push_back(static_cast<char>(t));
    } else if (t == kEndOfText) {
      text += "<|endoftext|>";
    } else {
      append_token_id(text, t);
    }
  }
  return text;
}

}  // namespace cpf::models::data
