#include "models/data/packing.h"

#include <algorithm>

namespace cpf::models::data {
namespace {

// The token at unit position p of `doc` (the end-of-text past the document's tokens).
int64_t unit_token(const Document& doc, int64_t p, int64_t eot) {
  return p < static_cast<int64_t>(doc.tokens.size()) ? doc.tokens[static_cast<size_t>(p)] : eot;
}

// Whether unit position p is a training target: the end-of-text always, a token unless in the prompt.
bool is_target(const Document& doc, int64_t p) {
  return p >= static_cast<int64_t>(doc.tokens.size()) || p >= doc.prompt_length;
}

void check_pad_multiple(int64_t pad_multiple, const char* op) {
  CPF_CHECK(pad_multiple >= 1, op, ": pad_multiple=", pad_multiple, " must be at least 1");
}

int64_t count_valid(const std::vector<int64_t>& labels) {
  return static_cast<int64_t>(std::count_if(labels.begin(), labels.end(), [](int64_t l) { return l != kIgnoreLabel; }));
}

}  // namespace

int64_t Batch::max_seqlen() const {
  int64_t longest = 0;
  for (size_t i = 1; i < cu_seqlens.size(); ++i) longest = std::max(longest, cu_seqlens[i] - cu_seqlens[i - 1]);
  return longest;
}

const Document& DocumentCache::get(int64_t index) {
  for (int slot = 0; slot < kSlots; ++slot) {
    if (ids_[slot] == index) return documents_[slot];
  }
  const int slot = next_;
  next_ = (next_ + 1) % kSlots;
  ids_[slot] = -1;  // stays invalid if document() throws
  documents_[slot] = source_.document(index);
  CPF_CHECK(!documents_[slot].tokens.empty(), source_.name(), ": document ", index, " is empty");
  ids_[slot] = index;
  return documents_[slot];
}

int64_t round_up(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

void fill_piece(DocumentCache& cache, const Piece& piece, int64_t* out_tokens, int64_t* out_labels) {
  const int64_t eot = cache.source().eot_token();
  // The end-of-text label (window mode) comes from the next document; fetch it first so the reference
  // to this piece's document below stays valid.
  int64_t eot_label = kIgnoreLabel;
  if (piece.next_document >= 0) {
    const Document& next = cache.get(piece.next_document);
    eot_label = is_target(next, 0) ? next.tokens.front() : kIgnoreLabel;
  }
  const Document& doc = cache.get(piece.document);
  const int64_t unit_length = static_cast<int64_t>(doc.tokens.size()) + 1;
  CPF_CHECK(piece.begin >= 0 && piece.begin < piece.end && piece.end <= unit_length, "fill_piece: piece [", piece.begin,
            ", ", piece.end, ") is outside document ", piece.document, "'s ", unit_length,
            " tokens (end-of-text included)");
  for (int64_t p = piece.begin; p < piece.end; ++p) {
    const int64_t i = p - piece.begin;
    out_tokens[i] = unit_token(doc, p, eot);
    if (p + 1 < unit_length) {
      out_labels[i] = is_target(doc, p + 1) ? unit_token(doc, p + 1, eot) : kIgnoreLabel;
    } else {
      out_labels[i] = eot_label;
    }
  }
}

Batch pack_thd(DocumentCache& cache, const std::vector<Piece>& pieces, int64_t tokens_per_batch, int64_t pad_multiple) {
  check_pad_multiple(pad_multiple, "pack_thd");
  CPF_CHECK(tokens_per_batch >= 1 && tokens_per_batch % pad_multiple == 0,
            "pack_thd: tokens_per_batch=", tokens_per_batch,
            " must be a positive multiple of pad_multiple=", pad_multiple);
  const int64_t T = tokens_per_batch;
  const int64_t eot = cache.source().eot_token();
  std::vector<int64_t> tokens(static_cast<size_t>(T), eot), labels(static_cast<size_t>(T), kIgnoreLabel),
      positions(static_cast<size_t>(T), 0);
  Batch batch;
  batch.layout = Layout::thd;
  batch.pad_multiple = pad_multiple;
  batch.cu_seqlens = {0};
  batch.cu_seqlens_padded = {0};
  for (const Piece& piece : pieces) {
    const int64_t start = batch.cu_seqlens_padded.back();
    const int64_t slot = round_up(piece.length(), pad_multiple);
    CPF_CHECK(start + slot <= T, "pack_thd: ", pieces.size(), " pieces do not fit in tokens_per_batch=", T,
              " (piece of document ", piece.document, " with ", piece.length(), " tokens starts at ", start, ")");
    fill_piece(cache, piece, tokens.data() + start, labels.data() + start);
    for (int64_t i = 0; i < slot; ++i) positions[static_cast<size_t>(start + i)] = i;
    batch.cu_seqlens.push_back(batch.cu_seqlens.back() + piece.length());
    batch.cu_seqlens_padded.push_back(start + slot);
    batch.documents.push_back(piece.document);
  }
  const int64_t used = batch.cu_seqlens_padded.back();
  if (used < T) {
    // The unused tail is one sequence of real length 0, so the padded offsets end at T.
    for (int64_t i = 0; i < T - used; ++i) positions[static_cast<size_t>(used + i)] = i;
    batch.cu_seqlens.push_back(batch.cu_seqlens.back());
    batch.cu_seqlens_padded.push_back(T);
    batch.documents.push_back(-1);
  }
  batch.num_valid_labels = count_valid(labels);
  batch.tokens = from_vector(tokens, {T});
  batch.labels = from_vector(labels, {T});
  batch.positions = from_vector(positions, {T});
  return batch;
}

Batch pack_bshd(DocumentCache& cache, const std::vector<std::vector<Piece>>& rows, int64_t seq_len,
                int64_t pad_multiple) {
  check_pad_multiple(pad_multiple, "pack_bshd");
  CPF_CHECK(!rows.empty(), "pack_bshd: no rows");
  CPF_CHECK(seq_len >= 1 && seq_len % pad_multiple == 0, "pack_bshd: seq_len=", seq_len,
            " must be a positive multiple of pad_multiple=", pad_multiple);
  const int64_t B = static_cast<int64_t>(rows.size());
  const int64_t T = seq_len;
  const int64_t eot = cache.source().eot_token();
  std::vector<int64_t> tokens(static_cast<size_t>(B * T), eot), labels(static_cast<size_t>(B * T), kIgnoreLabel),
      positions(static_cast<size_t>(B * T));
  Batch batch;
  batch.layout = Layout::bshd;
  batch.pad_multiple = pad_multiple;
  const bool one_piece_rows =
      std::all_of(rows.begin(), rows.end(), [](const std::vector<Piece>& row) { return row.size() <= 1; });
  for (int64_t r = 0; r < B; ++r) {
    int64_t used = 0;
    for (const Piece& piece : rows[static_cast<size_t>(r)]) {
      CPF_CHECK(used + piece.length() <= T, "pack_bshd: row ", r, " holds more than seq_len=", T, " tokens");
      fill_piece(cache, piece, tokens.data() + r * T + used, labels.data() + r * T + used);
      used += piece.length();
    }
    for (int64_t i = 0; i < T; ++i) positions[static_cast<size_t>(r * T + i)] = i;
    if (one_piece_rows) batch.documents.push_back(rows[static_cast<size_t>(r)].empty() ? -1 : rows[r].front().document);
  }
  batch.num_valid_labels = count_valid(labels);
  batch.tokens = from_vector(tokens, {B, T});
  batch.labels = from_vector(labels, {B, T});
  batch.positions = from_vector(positions, {B, T});
  return batch;
}

}  // namespace cpf::models::data
