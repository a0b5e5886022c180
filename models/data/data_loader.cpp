#include "models/data/data_loader.h"

#include <algorithm>
#include <utility>

namespace cpf::models::data {
namespace {

std::shared_ptr<const DocumentSource> checked_source(std::shared_ptr<const DocumentSource> source,
                                                     const DataOptions& options, int64_t dp_rank, int64_t dp_size) {
  validate_data_options(options);
  CPF_CHECK(dp_size >= 1, "DataLoader: dp_size=", dp_size, " must be at least 1");
  CPF_CHECK(dp_rank >= 0 && dp_rank < dp_size, "DataLoader: dp_rank=", dp_rank, " is outside [0, dp_size=", dp_size,
            ")");
  CPF_CHECK(source != nullptr, "DataLoader: no document source");
  CPF_CHECK(source->num_documents() >= 1, "DataLoader: source ", source->name(), " has no documents");
  return source;
}

}  // namespace

DataLoader::DataLoader(const DataOptions& options, int64_t dp_rank, int64_t dp_size)
    : DataLoader(make_document_source(options), options, dp_rank, dp_size) {}

DataLoader::DataLoader(std::shared_ptr<const DocumentSource> source, const DataOptions& options, int64_t dp_rank,
                       int64_t dp_size)
    : options_(options),
      source_(checked_source(std::move(source), options, dp_rank, dp_size)),
      dp_rank_(dp_rank),
      dp_size_(dp_size),
      tokens_per_batch_(effective_tokens_per_batch(options)),
      order_(source_->num_documents(), options.seed, options.shuffle),
      cache_(*source_) {}

int64_t DataLoader::unit_length_at(const DataCursor& cursor) {
  return source_->document_length(order_.document_at(cursor.epoch, cursor.index)) + 1;
}

void DataLoader::advance(DataCursor& cursor, int64_t tokens, int64_t unit_length) {
  cursor.offset += tokens;
  if (cursor.offset < unit_length) return;
  cursor.offset = 0;
  if (++cursor.index == order_.num_documents()) {
    cursor.index = 0;
    ++cursor.epoch;
  }
}

std::vector<std::vector<Piece>> DataLoader::plan_batch(DataCursor& cursor) {
  const int64_t seq_len = options_.seq_len;
  std::vector<std::vector<Piece>> rows;
  if (options_.layout == "thd") {
    // Greedy in stream order; validate_data_options guarantees that one padded piece always fits.
    std::vector<Piece> pieces;
    int64_t used = 0;
    while (true) {
      const int64_t unit = unit_length_at(cursor);
      const int64_t take = std::min(seq_len, unit - cursor.offset);
      const int64_t slot = round_up(take, options_.pad_multiple);
      if (used + slot > tokens_per_batch_) break;
      pieces.push_back({order_.document_at(cursor.epoch, cursor.index), cursor.offset, cursor.offset + take});
      used += slot;
      advance(cursor, take, unit);
    }
    rows.push_back(std::move(pieces));
  } else if (options_.bshd_fill == "document") {
    for (int64_t r = 0; r < options_.batch_size; ++r) {
      const int64_t unit = unit_length_at(cursor);
      const int64_t take = std::min(seq_len, unit - cursor.offset);
      rows.push_back({{order_.document_at(cursor.epoch, cursor.index), cursor.offset, cursor.offset + take}});
      advance(cursor, take, unit);
    }
  } else {
    for (int64_t r = 0; r < options_.batch_size; ++r) {
      std::vector<Piece> row;
      for (int64_t need = seq_len; need > 0;) {
        const int64_t unit = unit_length_at(cursor);
        const int64_t take = std::min(need, unit - cursor.offset);
        Piece piece{order_.document_at(cursor.epoch, cursor.index), cursor.offset, cursor.offset + take};
        advance(cursor, take, unit);
        // A row's last token needs the next stream token as its label, even across units.
        if (piece.end == unit) piece.next_document = order_.document_at(cursor.epoch, cursor.index);
        row.push_back(piece);
        need -= take;
      }
      rows.push_back(std::move(row));
    }
  }
  return rows;
}

Batch DataLoader::build_batch(const std::vector<std::vector<Piece>>& rows) {
  if (options_.layout == "thd") return pack_thd(cache_, rows.front(), tokens_per_batch_, options_.pad_multiple);
  return pack_bshd(cache_, rows, options_.seq_len, options_.pad_multiple);
}

Batch DataLoader::next() {
  Batch mine;
  try {
    for (int64_t slot = 0; slot < dp_size_; ++slot) {
      const auto rows = plan_batch(cursor_);
      if (slot == dp_rank_) mine = build_batch(rows);
    }
  } catch (const DataReadError&) {
    throw;
  } catch (const Error& e) {
    throw DataReadError(e);
  }
  return mine;
}

void DataLoader::set_cursor(const DataCursor& cursor) {
  const int64_t n = order_.num_documents();
  CPF_CHECK(cursor.epoch >= 0 && cursor.epoch <= UINT32_MAX, "DataLoader: cursor ", cursor.str(),
            ": epoch is outside [0, 2^32)");
  CPF_CHECK(cursor.index >= 0 && cursor.index < n, "DataLoader: cursor ", cursor.str(), ": index is outside [0, ", n,
            ") for source ", source_->name(), " (was the checkpoint written with other data?)");
  const int64_t unit = unit_length_at(cursor);
  CPF_CHECK(cursor.offset >= 0 && cursor.offset < unit, "DataLoader: cursor ", cursor.str(), ": offset is outside the ",
            unit, " tokens (end-of-text included) of the document at that index",
            " (was the checkpoint written with other data?)");
  cursor_ = cursor;
}

}  // namespace cpf::models::data
