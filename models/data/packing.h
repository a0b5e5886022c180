#pragma once
// Packing pieces of documents into batches.
//
// Every document is followed by one end-of-text token; call the result a "unit" of length L = tokens + 1.
// A piece is a slice [begin, end) of a unit. Labels follow one rule everywhere: the label of unit
// position p is the token at p + 1 when that token is a training target (not part of the prompt), else
// -100; the label of the end-of-text is -100, except in bshd window mode, where the next unit's first
// token follows it in the same row (then it is a target unless it is a prompt token).
//
// THD (packed, attention never crosses a document):
//   every piece is one sequence; its slot is padded to a multiple of pad_multiple (2 * cp_size for CP);
//   the batch is a fixed budget of T = tokens_per_batch storage tokens; when the pieces do not fill it,
//   the rest is one last padding-only sequence of real length 0 (so cu_seqlens_padded.back() == T).
//
//     two units "ab." and "cdef." , pad_multiple 4, T = 16:
//       tokens            a b . _ c d e f . _ _ _ _ _ _ _        (_ = padding, the end-of-text id)
//       cu_seqlens        [0, 3, 8, 8]
//       cu_seqlens_padded [0, 4, 12, 16]
//       positions         0 1 2 3 0 1 2 3 4 5 6 7 0 1 2 3       (padding continues its slot's count)
//       labels            b . - - d e f . - - - - - - - -       (- = -100)
//
// BSHD (fixed shape (B, T)):
//   document: every row holds one piece of at most T tokens, padded to T;
//   window:   rows are consecutive T-token windows of the unit stream (llm.c style): a row may hold
//             several documents, which then attend to each other; positions are 0..T-1.
#include <cstdint>
#include <string>
#include <vector>

#include "framework/tensor/tensor.h"
#include "models/data/deprecated_namespace.h"
#include "models/data/document_source.h"

namespace cpf::models::data {

constexpr int64_t kIgnoreLabel = -100;

enum class Layout { thd, bshd };

struct Batch {
  Layout layout = Layout::thd;
  Tensor tokens;                           // i64, thd: (T), bshd: (B, T); padding holds the end-of-text id
  Tensor labels;                           // i64, like tokens; kIgnoreLabel where there is no loss
  Tensor positions;                        // i64, like tokens; position inside the sequence (thd) or the row (bshd)
  std::vector<int64_t> cu_seqlens;         // thd: (N+1) cumulative real lengths, global
  std::vector<int64_t> cu_seqlens_padded;  // thd: (N+1) storage offsets; back() == T
  // thd: the source document of each sequence (-1 for the padding tail); bshd document mode: of each
  // row (-1 for an empty row); empty in window mode.
  std::vector<int64_t> documents;
  int64_t pad_multiple = 1;
  int64_t num_valid_labels = 0;  // labels != kIgnoreLabel

  int64_t num_sequences() const { return static_cast<int64_t>(cu_seqlens.size()) - 1; }
  int64_t max_seqlen() const;  // thd: the longest real length
};

// A slice of one document's unit (document tokens + end-of-text).
struct Piece {
  int64_t document = 0;
  int64_t begin = 0;
  int64_t end = 0;
  // The document whose unit follows in the stream: only set (>= 0) in window mode, where it provides
  // the label of the end-of-text.
  int64_t next_document = -1;
  int64_t length() const { return end - begin; }
};

// Keeps the last few documents fetched, since consecutive pieces come from the same document.
class DocumentCache {
 public:
  explicit DocumentCache(const DocumentSource& source) : source_(source) {}
  const Document& get(int64_t index);
  const DocumentSource& source() const { return source_; }

 private:
  const DocumentSource& source_;
  static constexpr int kSlots = 4;
  int64_t ids_[kSlots] = {-1, -1, -1, -1};
  Document documents_[kSlots];
  int next_ = 0;
};

int64_t round_up(int64_t value, int64_t multiple);

// Fills tokens/labels for `piece` into out_tokens / out_labels (length piece.length()).
void fill_piece(DocumentCache& cache, const Piece& piece, int64_t* out_tokens, int64_t* out_labels);

// One THD batch of T = tokens_per_batch storage tokens from `pieces` (each piece a sequence). Throws
// when the padded pieces do not fit.
Batch pack_thd(DocumentCache& cache, const std::vector<Piece>& pieces, int64_t tokens_per_batch, int64_t pad_multiple);

// A (B, T) batch, B = rows.size(): row r is the concatenation of rows[r]'s pieces, padded to T.
// `documents` is filled when every row holds at most one piece (document mode).
Batch pack_bshd(DocumentCache& cache, const std::vector<std::vector<Piece>>& rows, int64_t seq_len,
                int64_t pad_multiple);

}  // namespace cpf::models::data
