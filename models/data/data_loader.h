#pragma once
// DataLoader: the stream of batches a training rank consumes.
//
//   DataLoader loader(options, dp_rank, dp_size);
//   Batch batch = loader.next();                            // this DP rank's global batch
//   LocalBatch local = shard_for_rank(batch, cp_size, cp_rank);   // models/data/cp_shard.h
//   checkpoint.data_cursor = loader.cursor().str();         // resume: loader.set_cursor(parse_data_cursor(...))
//
// Stream: documents in the per-epoch shuffled order of models/data/data_order.h, each followed by an
// end-of-text token, cut into global batches by models/data/packing.h:
//   thd           pieces of at most seq_len tokens are packed, in stream order, into batches of
//                 tokens_per_batch storage tokens; a piece that does not fit opens the next batch
//   bshd document batch_size rows, each the next piece of at most seq_len tokens
//   bshd window   batch_size rows of seq_len consecutive stream tokens
//
// Data parallelism: global batch g goes to DP rank g mod dp_size, so one training step consumes dp_size
// consecutive global batches and every rank sees a different one. Each rank plans all dp_size batches
// (cheap: only document lengths are read) and builds only its own. After next() the cursor is the same
// on every rank and names a global stream position: save it from any rank, restore it on all; a run
// resumed with another dp_size continues the same global stream.
#include <cstdint>
#include <memory>
#include <vector>

#include "models/data/data_options.h"
#include "models/data/data_order.h"
#include "models/data/deprecated_namespace.h"
#include "models/data/packing.h"
#include "models/data/synthetic_tasks.h"

namespace cpf::models::data {

// A document source that failed while the loader read a batch: its message names the file. A type of its
// own so a trainer can tell a data failure (the CLI's exit code 3) from any other error of a step.
class DataReadError : public Error {
 public:
  explicit DataReadError(const Error& cause) : Error(cause.file(), cause.line(), cause.condition(), cause.message()) {}
};

class DataLoader {
 public:
  // Opens the source named by options (make_document_source).
  explicit DataLoader(const DataOptions& options, int64_t dp_rank = 0, int64_t dp_size = 1);
  // Shares an already opened source, e.g. between the DP ranks of the thread backend.
  DataLoader(std::shared_ptr<const DocumentSource> source, const DataOptions& options, int64_t dp_rank = 0,
             int64_t dp_size = 1);

  // This rank's batch of the next step; advances the cursor past the step's dp_size global batches.
  // Throws DataReadError (below) when the source fails to read (a shard truncated under the run, say).
  Batch next();

  const DataCursor& cursor() const { return cursor_; }
  // Continues from a saved cursor; throws when it does not name a position of this source.
  void set_cursor(const DataCursor& cursor);

  const DocumentSource& source() const { return *source_; }
  const std::shared_ptr<const DocumentSource>& shared_source() const { return source_; }
  // The synthetic source (for exact-match evaluation), or nullptr for text and shards.
  const SyntheticSource* synthetic() const { return dynamic_cast<const SyntheticSource*>(source_.get()); }
  const DataOptions& options() const { return options_; }
  int64_t dp_rank() const { return dp_rank_; }
  int64_t dp_size() const { return dp_size_; }
  int64_t tokens_per_batch() const { return tokens_per_batch_; }

 private:
  // The pieces of the global batch at `cursor` (thd: one row holding every sequence), advancing it.
  std::vector<std::vector<Piece>> plan_batch(DataCursor& cursor);
  Batch build_batch(const std::vector<std::vector<Piece>>& rows);
  int64_t unit_length_at(const DataCursor& cursor);  // document tokens + end-of-text
  void advance(DataCursor& cursor, int64_t tokens, int64_t unit_length);

  DataOptions options_;
  std::shared_ptr<const DocumentSource> source_;
  int64_t dp_rank_;
  int64_t dp_size_;
  int64_t tokens_per_batch_;
  DocumentOrder order_;
  DocumentCache cache_;
  DataCursor cursor_;
};

}  // namespace cpf::models::data
