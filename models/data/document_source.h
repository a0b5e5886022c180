#pragma once
// DocumentSource: a finite, indexable set of documents of token ids, the one interface the loader
// reads (synthetic tasks, byte-level text files, llm.c token shards).
//
// A document holds its tokens without an end-of-text token: the packer appends exactly one after every
// document, so a document is never glued to the next one. The end-of-text token is always a training
// target (the model learns where a document ends); tokens before `prompt_length` are context only
// (the question of a synthetic task), so their labels are masked.
//
// Sources are immutable after construction and their const methods are safe to call from several
// threads, so the DP ranks of the thread backend can share one source.
#include <cstdint>
#include <string>
#include <vector>

#include "framework/core/error.h"
#include "models/data/deprecated_namespace.h"

namespace cpf::models::data {

struct Document {
  std::vector<int64_t> tokens;  // at least one token, never the end-of-text token
  int64_t prompt_length = 0;    // tokens[i] with i < prompt_length are never a training target
};

class DocumentSource {
 public:
  virtual ~DocumentSource() = default;

  // "synthetic:addition", "text", "shards": used in messages and logs.
  virtual std::string name() const = 0;
  virtual int64_t num_documents() const = 0;
  // Token count of document `index` (end-of-text not included); cheaper than document(index).
  virtual int64_t document_length(int64_t index) const = 0;
  virtual Document document(int64_t index) const = 0;
  // Token ids lie in [0, vocab_size()); eot_token() is one of them.
  virtual int64_t vocab_size() const = 0;
  virtual int64_t eot_token() const = 0;
  // Human-readable rendering of token ids (samples in logs); ids it cannot render print as <id>.
  virtual std::string decode(const std::vector<int64_t>& tokens) const = 0;
};

// Throws unless 0 <= index < num_documents, naming the source.
inline void check_document_index(const DocumentSource& source, int64_t index) {
  CPF_CHECK(index >= 0 && index < source.num_documents(), source.name(), ": document index ", index, " is outside [0, ",
            source.num_documents(), ")");
}

// Appends "<id>": how decode() renders a token id it has no text for.
inline void append_token_id(std::string& text, int64_t id) {
  text += '<';
  text += std::to_string(id);
  text += '>';
}

}  // namespace cpf::models::data
