#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>

#include "models/data/data_loader.h"
#include "support/test_utils.h"

namespace cpf::models::data {
namespace {

namespace v = synthetic_vocab;

// Sort lists of up to 12 items: units of up to 25 tokens, so seq_len 8 cuts many documents into pieces.
DataOptions sort_options() {
  DataOptions o;
  o.task = "sort";
  o.min_len = 1;
  o.max_len = 12;
  o.num_examples = 40;
  o.seq_len = 8;
  o.batch_size = 4;  // T = 32
  o.pad_multiple = 4;
  o.seed = 99;
  return o;
}

bool same_batch(const Batch& a, const Batch& b) {
  return a.layout == b.layout && a.tokens.to_vector<int64_t>() == b.tokens.to_vector<int64_t>() &&
         a.labels.to_vector<int64_t>() == b.labels.to_vector<int64_t>() &&
         a.positions.to_vector<int64_t>() == b.positions.to_vector<int64_t>() && a.cu_seqlens == b.cu_seqlens &&
         a.cu_seqlens_padded == b.cu_seqlens_padded && a.documents == b.documents &&
         a.num_valid_labels == b.num_valid_labels;
}

struct Sequence {
  int64_t document;
  std::vector<int64_t> tokens;  // real tokens only
  std::vector<int64_t> labels;
};

std::vector<Sequence> sequences_of(const Batch& b) {
  const auto tokens = b.tokens.to_vector<int64_t>();
  const auto labels = b.labels.to_vector<int64_t>();
  std::vector<Sequence> out;
  for (int64_t s = 0; s < b.num_sequences(); ++s) {
    const int64_t start = b.cu_seqlens_padded[s], real = b.cu_seqlens[s + 1] - b.cu_seqlens[s];
    out.push_back({b.documents[s], std::vector<int64_t>(tokens.begin() + start, tokens.begin() + start + real),
                   std::vector<int64_t>(labels.begin() + start, labels.begin() + start + real)});
  }
  return out;
}

TEST(DataLoader, SameSeedGivesTheSameBatchesAndAnotherSeedDoesNot) {
  DataLoader a(sort_options()), b(sort_options());
  DataOptions other = sort_options();
  other.seed = 100;
  DataLoader c(other);
  int differ = 0;
  for (int step = 0; step < 20; ++step) {
    const Batch x = a.next();
    EXPECT_TRUE(same_batch(x, b.next())) << "step " << step;
    differ += !same_batch(x, c.next());
  }
  EXPECT_GE(differ, 19);
  EXPECT_EQ(a.cursor(), b.cursor());
}

TEST(DataLoader, PackingNeverCrossesDocumentsAndPiecesRebuildEveryDocument) {
  DataLoader loader(sort_options());
  const DocumentSource& source = loader.source();
  const int64_t eot = source.eot_token();
  std::vector<int64_t> unit;  // pieces of the document being rebuilt
  int64_t unit_doc = -1;
  std::vector<int64_t> completed;
  for (int step = 0; step < 120; ++step) {
    const Batch b = loader.next();
    for (const Sequence& seq : sequences_of(b)) {
      if (seq.document < 0) {
        EXPECT_TRUE(seq.tokens.empty());  // the padding tail
        continue;
      }
      EXPECT_LE(static_cast<int64_t>(seq.tokens.size()), 8);
      EXPECT_GE(seq.tokens.size(), 1u);
      // End-of-text only as the last real token of a sequence.
      for (size_t i = 0; i + 1 < seq.tokens.size(); ++i) EXPECT_NE(seq.tokens[i], eot);
      if (unit_doc != seq.document) {
        EXPECT_TRUE(unit.empty()) << "document " << unit_doc << " was left unfinished";
        unit_doc = seq.document;
      }
      unit.insert(unit.end(), seq.tokens.begin(), seq.tokens.end());
      if (seq.tokens.back() == eot) {
        std::vector<int64_t> expected = source.document(unit_doc).tokens;
        expected.push_back(eot);
        EXPECT_EQ(unit, expected) << "document " << unit_doc;
        completed.push_back(unit_doc);
        unit.clear();
      }
    }
  }
  // Each epoch (40 documents) is a permutation, and consecutive epochs differ.
  ASSERT_GE(completed.size(), 80u);
  std::vector<int64_t> e0(completed.begin(), completed.begin() + 40),
      e1(completed.begin() + 40, completed.begin() + 80);
  EXPECT_NE(e0, e1);
  std::sort(e0.begin(), e0.end());
  std::sort(e1.begin(), e1.end());
  std::vector<int64_t> all(40);
  std::iota(all.begin(), all.end(), int64_t{0});
  EXPECT_EQ(e0, all);
  EXPECT_EQ(e1, all);
}

TEST(DataLoader, LabelsTrainOnlyTheAnswerAndTheEndOfText) {
  DataOptions o;  // addition, 1..3 digits: units of at most 13 tokens, never cut at seq_len 16
  o.seq_len = 16;
  o.batch_size = 4;
  o.num_examples = 30;
  DataLoader loader(o);
  for (int step = 0; step < 10; ++step) {
    const Batch b = loader.next();
    int64_t valid = 0;
    for (const Sequence& seq : sequences_of(b)) {
      if (seq.document < 0) continue;
      ASSERT_EQ(seq.tokens.back(), v::kEndOfText);
      const int64_t prompt = std::find(seq.tokens.begin(), seq.tokens.end(), v::kEquals) - seq.tokens.begin() + 1;
      for (size_t i = 0; i < seq.tokens.size(); ++i) {
        const bool trained = i + 1 < seq.tokens.size() && static_cast<int64_t>(i + 1) >= prompt;
        EXPECT_EQ(seq.labels[i], trained ? seq.tokens[i + 1] : kIgnoreLabel) << "position " << i;
        valid += trained;
      }
    }
    EXPECT_EQ(b.num_valid_labels, valid);
    // Padding positions carry no label either.
    const auto labels = b.labels.to_vector<int64_t>();
    EXPECT_EQ(std::count_if(labels.begin(), labels.end(), [](int64_t l) { return l != kIgnoreLabel; }), valid);
  }
}

TEST(DataLoader, SlotsArePaddedToThePadMultiple) {
  for (int64_t pad : {1, 2, 4, 6}) {
    DataOptions o = sort_options();
    o.pad_multiple = pad;
    o.seq_len = 7;
    o.tokens_per_batch = 6 * pad * 4;
    DataLoader loader(o);
    EXPECT_EQ(loader.tokens_per_batch(), 24 * pad);
    for (int step = 0; step < 10; ++step) {
      const Batch b = loader.next();
      EXPECT_EQ(b.tokens.shape(), (Shape{24 * pad}));
      EXPECT_EQ(b.cu_seqlens_padded.back(), 24 * pad);
      const auto positions = b.positions.to_vector<int64_t>();
      for (int64_t s = 0; s < b.num_sequences(); ++s) {
        const int64_t slot = b.cu_seqlens_padded[s + 1] - b.cu_seqlens_padded[s];
        const int64_t real = b.cu_seqlens[s + 1] - b.cu_seqlens[s];
        EXPECT_EQ(slot % pad, 0);
        EXPECT_GE(slot, real);
        if (b.documents[s] >= 0) EXPECT_LT(slot - real, pad);
        for (int64_t i = 0; i < slot; ++i) EXPECT_EQ(positions[b.cu_seqlens_padded[s] + i], i);
      }
    }
  }
}

TEST(DataLoader, ResumingFromASavedCursorReproducesTheRestOfTheStream) {
  for (const char* mode : {"thd", "document", "window"}) {
    DataOptions o = sort_options();
    if (std::string(mode) != "thd") {
      o.layout = "bshd";
      o.bshd_fill = mode;
    }
    for (int64_t dp : {1, 2}) {
      DataLoader first(o, dp - 1, dp);
      for (int step = 0; step < 7; ++step) first.next();
      const std::string saved = first.cursor().str();
      DataLoader resumed(o, dp - 1, dp);
      resumed.set_cursor(parse_data_cursor(saved));
      for (int step = 0; step < 25; ++step) {
        EXPECT_TRUE(same_batch(first.next(), resumed.next())) << mode << " dp " << dp << " step " << step;
      }
      EXPECT_EQ(first.cursor(), resumed.cursor());
    }
  }
}

TEST(DataLoader, DataParallelRanksTakeAlternateGlobalBatches) {
  DataOptions o = sort_options();
  DataLoader global(o);
  DataLoader rank0(o, 0, 2), rank1(o, 1, 2);
  const auto shared = rank0.shared_source();
  DataLoader rank1_shared(shared, o, 1, 2);
  for (int step = 0; step < 30; ++step) {
    const Batch g0 = global.next(), g1 = global.next();
    const Batch r0 = rank0.next(), r1 = rank1.next();
    EXPECT_TRUE(same_batch(r0, g0)) << "step " << step;
    EXPECT_TRUE(same_batch(r1, g1)) << "step " << step;
    EXPECT_TRUE(same_batch(rank1_shared.next(), g1)) << "step " << step;
    EXPECT_FALSE(same_batch(r0, r1));
    EXPECT_EQ(rank0.cursor(), rank1.cursor());
    EXPECT_EQ(rank0.cursor(), global.cursor());
  }
}

TEST(DataLoader, BshdDocumentRowsHoldOnePieceEach) {
  DataOptions o = sort_options();
  o.layout = "bshd";
  o.seq_len = 12;
  DataLoader loader(o);
  const int64_t eot = loader.source().eot_token();
  for (int step = 0; step < 10; ++step) {
    const Batch b = loader.next();
    EXPECT_EQ(b.tokens.shape(), (Shape{4, 12}));
    ASSERT_EQ(b.documents.size(), 4u);
    const auto tokens = b.tokens.to_vector<int64_t>();
    const auto labels = b.labels.to_vector<int64_t>();
    for (int64_t r = 0; r < 4; ++r) {
      // Real tokens, then padding: once an end-of-text is seen, nothing after it has a label.
      bool after_eot = false;
      for (int64_t i = 0; i < 12; ++i) {
        if (after_eot) {
          EXPECT_EQ(tokens[r * 12 + i], eot);
          EXPECT_EQ(labels[r * 12 + i], kIgnoreLabel);
        }
        after_eot = after_eot || tokens[r * 12 + i] == eot;
      }
    }
  }
}

TEST(DataLoader, BshdWindowsAreTheContiguousStreamWithNextTokenLabels) {
  DataOptions o = sort_options();
  o.layout = "bshd";
  o.bshd_fill = "window";
  o.shuffle = false;
  DataLoader loader(o);
  const DocumentSource& source = loader.source();
  std::vector<int64_t> stream;  // documents 0, 1, 2, ... each with its end-of-text
  std::vector<uint8_t> target;
  for (int64_t d = 0; static_cast<int64_t>(stream.size()) < 3 * 4 * 8 + 1; ++d) {
    const Document doc = source.document(d);
    for (size_t i = 0; i < doc.tokens.size(); ++i) {
      stream.push_back(doc.tokens[i]);
      target.push_back(static_cast<int64_t>(i) >= doc.prompt_length);
    }
    stream.push_back(source.eot_token());
    target.push_back(1);
  }
  for (int step = 0; step < 3; ++step) {
    const Batch b = loader.next();
    const auto tokens = b.tokens.to_vector<int64_t>();
    const auto labels = b.labels.to_vector<int64_t>();
    for (size_t i = 0; i < tokens.size(); ++i) {
      const size_t at = static_cast<size_t>(step) * 32 + i;
      EXPECT_EQ(tokens[i], stream[at]) << at;
      EXPECT_EQ(labels[i], target[at + 1] ? stream[at + 1] : kIgnoreLabel) << at;
    }
    EXPECT_EQ(b.positions.to_vector<int64_t>()[9], 1);  // row 1, column 1
  }
}

TEST(DataOrder, EpochOrdersArePermutationsDrivenBySeedAndEpoch) {
  const auto a = epoch_order(50, 1, 0, true);
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> identity(50);
  std::iota(identity.begin(), identity.end(), int64_t{0});
  EXPECT_EQ(sorted, identity);
  EXPECT_EQ(a, epoch_order(50, 1, 0, true));
  EXPECT_NE(a, epoch_order(50, 1, 1, true));
  EXPECT_NE(a, epoch_order(50, 2, 0, true));
  EXPECT_EQ(epoch_order(50, 1, 0, false), identity);
  DocumentOrder order(50, 1, true);
  for (int64_t e : {0, 1, 2, 0}) EXPECT_EQ(order.document_at(e, 7), epoch_order(50, 1, e, true)[7]);
  EXPECT_CPF_ERROR(order.document_at(0, 50), "DocumentOrder: index 50 is outside [0, 50)");
  EXPECT_CPF_ERROR(epoch_order(0, 1, 0, true), "num_documents=0 must be at least 1");
  EXPECT_CPF_ERROR(epoch_order(5, 1, -1, true), "epoch=-1 is outside [0, 2^32)");
  EXPECT_CPF_ERROR(uniform_below(3, 0), "uniform_below: n=0 must be at least 1");
}

TEST(DataCursor, StringRoundTripAndParseErrors) {
  const DataCursor c{3, 17, 5};
  EXPECT_EQ(c.str(), "epoch=3 index=17 offset=5");
  EXPECT_EQ(parse_data_cursor(c.str()), c);
  EXPECT_CPF_ERROR(parse_data_cursor("epoch=1 index=2"), "expected 'offset=<integer>' as field 3");
  EXPECT_CPF_ERROR(parse_data_cursor("index=1 epoch=2 offset=0"), "expected 'epoch=<integer>' as field 1");
  EXPECT_CPF_ERROR(parse_data_cursor("epoch=1 index=x2 offset=0"), "'index=x2' is not a non-negative integer field");
  EXPECT_CPF_ERROR(parse_data_cursor("epoch=-1 index=2 offset=0"), "'epoch=-1' is not a non-negative integer field");
  EXPECT_CPF_ERROR(parse_data_cursor("epoch=1 index=2 offset=0 more"), "unexpected trailing text 'more'");
}

TEST(DataLoader, RejectsCursorsOutsideTheSource) {
  DataLoader loader(sort_options());
  EXPECT_CPF_ERROR(loader.set_cursor({0, 40, 0}), "cursor epoch=0 index=40 offset=0: index is outside [0, 40)");
  const int64_t doc = epoch_order(40, 99, 2, true)[5];
  const int64_t unit = loader.source().document_length(doc) + 1;
  EXPECT_CPF_ERROR(loader.set_cursor({2, 5, unit}), "offset is outside the " + std::to_string(unit) + " tokens");
  EXPECT_CPF_ERROR(loader.set_cursor({-1, 0, 0}), "epoch is outside [0, 2^32)");
  loader.set_cursor({2, 5, unit - 1});
  EXPECT_EQ(loader.cursor(), (DataCursor{2, 5, unit - 1}));
}

TEST(DataLoader, SourcesAndRankArguments) {
  DataLoader synthetic(sort_options());
  ASSERT_NE(synthetic.synthetic(), nullptr);
  EXPECT_EQ(synthetic.synthetic()->options().task, SyntheticTask::sort);
  EXPECT_EQ(synthetic.source().vocab_size(), 14);
  EXPECT_CPF_ERROR(DataLoader(sort_options(), 0, 0), "dp_size=0 must be at least 1");
  EXPECT_CPF_ERROR(DataLoader(sort_options(), 2, 2), "dp_rank=2 is outside [0, dp_size=2)");
  EXPECT_CPF_ERROR(DataLoader(nullptr, sort_options()), "DataLoader: no document source");
  DataOptions text = sort_options();
  text.source = "text";
  text.path = "/nonexistent/cpf_data_test.txt";
  EXPECT_CPF_ERROR(DataLoader{text}, "text source: file '/nonexistent/cpf_data_test.txt' does not exist");
  text.source = "shards";
  text.path = "/nonexistent/*.bin";
  EXPECT_CPF_ERROR(DataLoader{text}, "token shards: directory '/nonexistent' of pattern '/nonexistent/*.bin'");
}

TEST(DataOptions, EveryInvalidFieldIsRejectedByName) {
  auto expect_error = [](auto edit, const std::string& message) {
    DataOptions o = sort_options();
    edit(o);
    EXPECT_CPF_ERROR(validate_data_options(o), message);
  };
  expect_error([](DataOptions& o) { o.source = "hdf5"; }, "unknown source 'hdf5' (source: synthetic | text | shards)");
  expect_error([](DataOptions& o) { o.task = "divide"; }, "unknown synthetic task 'divide'");
  expect_error([](DataOptions& o) { o.min_len = 0; }, "needs 1 <= min_len <= max_len, got min_len=0 max_len=12");
  expect_error([](DataOptions& o) { o.min_len = 13; }, "got min_len=13 max_len=12");
  expect_error(
      [](DataOptions& o) {
        o.task = "addition";
        o.max_len = 19;
      },
      "addition operands of max_len=19 digits");
  expect_error([](DataOptions& o) { o.num_examples = 0; }, "num_examples=0 must be at least 1");
  expect_error([](DataOptions& o) { o.source = "text"; }, "source 'text' needs a path");
  expect_error(
      [](DataOptions& o) {
        o.source = "text";
        o.path = "a.txt";
        o.text_split = "para";
      },
      "unknown text_split 'para'");
  expect_error(
      [](DataOptions& o) {
        o.source = "text";
        o.path = "a.txt";
        o.text_split = "separator";
      },
      "text_split is 'separator' but text_separator is empty");
  expect_error(
      [](DataOptions& o) {
        o.source = "shards";
        o.path = "a.bin";
        o.vocab_size = (int64_t{1} << 31) + 1;
      },
      "vocab_size=2147483649 must lie in [1, 2^31]");
  expect_error(
      [](DataOptions& o) {
        o.source = "synthetic";
        o.tokenizer = "gpt2";
      },
      "tokenizer=gpt2 applies to source text or shards");
  expect_error(
      [](DataOptions& o) {
        o.source = "shards";
        o.path = "a.bin";
        o.eot_token = -1;
      },
      "eot_token=-1 is outside [0, vocab_size=50257)");
  expect_error([](DataOptions& o) { o.layout = "sbhd"; }, "unknown layout 'sbhd' (layout: thd | bshd)");
  expect_error([](DataOptions& o) { o.bshd_fill = "packed"; }, "unknown bshd_fill 'packed'");
  expect_error([](DataOptions& o) { o.seq_len = 0; }, "seq_len=0 must be at least 1");
  expect_error([](DataOptions& o) { o.batch_size = 0; }, "batch_size=0 must be at least 1");
  expect_error([](DataOptions& o) { o.pad_multiple = 0; }, "pad_multiple=0 must be at least 1");
  expect_error([](DataOptions& o) { o.tokens_per_batch = -4; }, "tokens_per_batch=-4 must be positive");
  expect_error(
      [](DataOptions& o) {
        o.layout = "bshd";
        o.tokens_per_batch = 64;
      },
      "tokens_per_batch=64 applies to layout thd only");
  expect_error(
      [](DataOptions& o) {
        o.layout = "bshd";
        o.seq_len = 10;
      },
      "bshd rows of seq_len=10 must be a multiple of pad_multiple=4");
  expect_error([](DataOptions& o) { o.tokens_per_batch = 30; },
               "tokens_per_batch=30 must be a multiple of pad_multiple=4");
  expect_error(
      [](DataOptions& o) {
        o.seq_len = 30;
        o.tokens_per_batch = 28;
      },
      "a piece of seq_len=30 tokens padded to a multiple of pad_multiple=4 (32) does not fit in "
      "tokens_per_batch=28");
  EXPECT_NO_THROW(validate_data_options(sort_options()));
  EXPECT_EQ(effective_tokens_per_batch(sort_options()), 32);
}

}  // namespace
}  // namespace cpf::models::data
