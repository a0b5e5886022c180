#include <gtest/gtest.h>

#include "models/data/packing.h"
#include "support/test_utils.h"

namespace cpf::models::data {
namespace {

// Documents given literally; end-of-text = 0, so tokens are small positive ids.
class VectorSource : public DocumentSource {
 public:
  explicit VectorSource(std::vector<Document> docs) : docs_(std::move(docs)) {}
  std::string name() const override { return "vector"; }
  int64_t num_documents() const override { return static_cast<int64_t>(docs_.size()); }
  int64_t document_length(int64_t i) const override { return static_cast<int64_t>(docs_.at(i).tokens.size()); }
  Document document(int64_t i) const override { return docs_.at(static_cast<size_t>(i)); }
  int64_t vocab_size() const override { return 100; }
  int64_t eot_token() const override { return 0; }
  std::string decode(const std::vector<int64_t>&) const override { return ""; }

 private:
  std::vector<Document> docs_;
};

constexpr int64_t X = kIgnoreLabel;

TEST(PackThd, MatchesTheDocumentedExample) {
  // "ab." and "cdef." with a=1 ... f=6, pad_multiple 4, T = 16 (packing.h's diagram).
  VectorSource source({{{1, 2}}, {{3, 4, 5, 6}}});
  DocumentCache cache(source);
  const Batch b = pack_thd(cache, {{0, 0, 3}, {1, 0, 5}}, 16, 4);
  EXPECT_EQ(b.layout, Layout::thd);
  EXPECT_EQ(b.tokens.to_vector<int64_t>(), (std::vector<int64_t>{1, 2, 0, 0, 3, 4, 5, 6, 0, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(b.cu_seqlens, (std::vector<int64_t>{0, 3, 8, 8}));
  EXPECT_EQ(b.cu_seqlens_padded, (std::vector<int64_t>{0, 4, 12, 16}));
  EXPECT_EQ(b.positions.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3}));
  EXPECT_EQ(b.labels.to_vector<int64_t>(), (std::vector<int64_t>{2, 0, X, X, 4, 5, 6, 0, X, X, X, X, X, X, X, X}));
  EXPECT_EQ(b.documents, (std::vector<int64_t>{0, 1, -1}));
  EXPECT_EQ(b.num_valid_labels, 6);
  EXPECT_EQ(b.num_sequences(), 3);
  EXPECT_EQ(b.max_seqlen(), 5);
  EXPECT_EQ(b.pad_multiple, 4);
  EXPECT_EQ(b.tokens.dtype(), DType::i64);
}

TEST(PackThd, ExactFitHasNoPaddingTailAndPromptTokensAreMasked) {
  // Prompt "1 2 3 =" (=9) then answer "4 5": only the answer and end-of-text are targets.
  VectorSource source({{{1, 2, 9, 4, 5}, 3}});
  DocumentCache cache(source);
  const Batch b = pack_thd(cache, {{0, 0, 6}}, 6, 2);
  EXPECT_EQ(b.cu_seqlens, (std::vector<int64_t>{0, 6}));
  EXPECT_EQ(b.cu_seqlens_padded, (std::vector<int64_t>{0, 6}));
  EXPECT_EQ(b.labels.to_vector<int64_t>(), (std::vector<int64_t>{X, X, 4, 5, 0, X}));
  EXPECT_EQ(b.num_valid_labels, 3);
}

TEST(PackThd, PiecesOfALongDocumentKeepTheirNextTokenLabels) {
  VectorSource source({{{1, 2, 3, 4, 5, 6, 7}}});  // unit of 8 tokens, cut in pieces of 3, 3, 2
  DocumentCache cache(source);
  const Batch b = pack_thd(cache, {{0, 0, 3}, {0, 3, 6}, {0, 6, 8}}, 12, 4);
  EXPECT_EQ(b.cu_seqlens, (std::vector<int64_t>{0, 3, 6, 8}));
  EXPECT_EQ(b.cu_seqlens_padded, (std::vector<int64_t>{0, 4, 8, 12}));
  EXPECT_EQ(b.tokens.to_vector<int64_t>(), (std::vector<int64_t>{1, 2, 3, 0, 4, 5, 6, 0, 7, 0, 0, 0}));
  // The last token of a piece is still trained on its successor (the same document).
  EXPECT_EQ(b.labels.to_vector<int64_t>(), (std::vector<int64_t>{2, 3, 4, X, 5, 6, 7, X, 0, X, X, X}));
  EXPECT_EQ(b.positions.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3}));
}

TEST(PackBshd, DocumentRowsAndWindowRows) {
  VectorSource source({{{1, 2}}, {{3, 4, 5}}, {{7, 8}, 1}});
  DocumentCache cache(source);
  const Batch rows = pack_bshd(cache, {{{0, 0, 3}}, {{1, 0, 4}}}, 4, 2);
  EXPECT_EQ(rows.layout, Layout::bshd);
  EXPECT_EQ(rows.tokens.shape(), (Shape{2, 4}));
  EXPECT_EQ(rows.tokens.to_vector<int64_t>(), (std::vector<int64_t>{1, 2, 0, 0, 3, 4, 5, 0}));
  EXPECT_EQ(rows.labels.to_vector<int64_t>(), (std::vector<int64_t>{2, 0, X, X, 4, 5, 0, X}));
  EXPECT_EQ(rows.positions.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 0, 1, 2, 3}));
  EXPECT_EQ(rows.documents, (std::vector<int64_t>{0, 1}));
  EXPECT_TRUE(rows.cu_seqlens.empty());

  // Window: "1 2 . 3 | 4 5 . 7" then 8 follows; document 2 has a one-token prompt (7), so the
  // end-of-text before it gets no label, and 8 is a target.
  const Batch windows = pack_bshd(cache, {{{0, 0, 3, 1}, {1, 0, 1}}, {{1, 1, 4, 2}, {2, 0, 1}}}, 4, 1);
  EXPECT_EQ(windows.tokens.to_vector<int64_t>(), (std::vector<int64_t>{1, 2, 0, 3, 4, 5, 0, 7}));
  EXPECT_EQ(windows.labels.to_vector<int64_t>(), (std::vector<int64_t>{2, 0, 3, 4, 5, 0, X, 8}));
  EXPECT_TRUE(windows.documents.empty());
  EXPECT_EQ(windows.num_valid_labels, 7);
}

TEST(Packing, RejectsPiecesThatDoNotFitAndBadSizes) {
  VectorSource source({{{1, 2, 3}}});
  DocumentCache cache(source);
  EXPECT_CPF_ERROR(
      pack_thd(cache, {{0, 0, 4}, {0, 0, 4}}, 6, 2),
      "pack_thd: 2 pieces do not fit in tokens_per_batch=6 (piece of document 0 with 4 tokens starts at 4)");
  EXPECT_CPF_ERROR(pack_thd(cache, {{0, 0, 4}}, 6, 4),
                   "tokens_per_batch=6 must be a positive multiple of pad_multiple=4");
  EXPECT_CPF_ERROR(pack_thd(cache, {{0, 0, 4}}, 8, 0), "pack_thd: pad_multiple=0 must be at least 1");
  EXPECT_CPF_ERROR(pack_thd(cache, {{0, 2, 6}}, 8, 1), "piece [2, 6) is outside document 0's 4 tokens");
  EXPECT_CPF_ERROR(pack_thd(cache, {{0, 2, 2}}, 8, 1), "piece [2, 2) is outside");
  EXPECT_CPF_ERROR(pack_bshd(cache, {{{0, 0, 4}, {0, 0, 4}}}, 6, 1), "pack_bshd: row 0 holds more than seq_len=6");
  EXPECT_CPF_ERROR(pack_bshd(cache, {}, 4, 1), "pack_bshd: no rows");
  EXPECT_CPF_ERROR(pack_bshd(cache, {{{0, 0, 4}}}, 6, 4), "seq_len=6 must be a positive multiple of pad_multiple=4");
  VectorSource with_empty(std::vector<Document>{Document{}});
  DocumentCache empty_cache(with_empty);
  EXPECT_CPF_ERROR(pack_thd(empty_cache, {{0, 0, 1}}, 4, 1), "vector: document 0 is empty");
}

}  // namespace
}  // namespace cpf::models::data
