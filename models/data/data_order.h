#pragma once
// The order in which the loader visits documents, and the cursor that records where it stands.
//
// Every epoch visits each document once, in an order that is a pure function of (seed, epoch): a
// Fisher-Yates shuffle whose swap for slot i draws from the Philox block with key `seed` and counter
// {i, epoch, domain}. Nothing depends on the history of the stream, so a saved cursor is enough to
// resume: rebuilding the order of the cursor's epoch reproduces the remaining stream exactly.
//
// The stream is the documents of epoch 0 in order, each followed by one end-of-text token, then
// those of epoch 1, ... A cursor names the next token of that stream:
//   epoch  = passes completed,
//   index  = slot in this epoch's order,
//   offset = tokens of that slot's document (end-of-text included) already consumed; documents longer
//            than a sequence are cut into pieces, so a batch may end inside one.
#include <cstdint>
#include <string>
#include <vector>
#include "models/data/deprecated_namespace.h"

namespace cpf::models::data {

struct DataCursor {
  int64_t epoch = 0;
  int64_t index = 0;
  int64_t offset = 0;

  bool operator==(const DataCursor&) const = default;
  // "epoch=E index=I offset=O", what parse_data_cursor reads back (checkpoint metadata).
  std::string str() const;
};

DataCursor parse_data_cursor(const std::string& text);

// ---- Philox-derived integers (the data pipeline's only randomness) ----

// Domains keep the data streams independent of each other under one seed.
enum class RandomDomain : uint32_t { shuffle = 0x53485546u, train_examples = 0x54524e00u, eval_examples = 0x4556414cu };

// 64 random bits, a pure function of (seed, domain, counter, sub).
uint64_t philox_bits(uint64_t seed, RandomDomain domain, uint64_t counter, uint32_t sub);
// An integer uniform in [0, n) from 64 random bits (multiply-high; bias below n / 2^64).
int64_t uniform_below(uint64_t bits, int64_t n);

// The permutation of 0..num_documents-1 visited in `epoch` (the identity when shuffle is false).
std::vector<int64_t> epoch_order(int64_t num_documents, uint64_t seed, int64_t epoch, bool shuffle);

// Maps (epoch, index) to a document id, keeping the orders of the two most recent epochs (a batch can
// straddle an epoch boundary).
class DocumentOrder {
 public:
  DocumentOrder(int64_t num_documents, uint64_t seed, bool shuffle);
  int64_t document_at(int64_t epoch, int64_t index);
  int64_t num_documents() const { return num_documents_; }

 private:
  int64_t num_documents_;
  uint64_t seed_;
  bool shuffle_;
  int64_t cached_epoch_[2] = {-1, -1};
  std::vector<int64_t> cached_order_[2];
  int next_slot_ = 0;
};

}  // namespace cpf::models::data
