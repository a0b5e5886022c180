#pragma once
// Evaluation during training (the per-batch loss is the training step's: training_step.h).
//
// Held-out data: the eval split of a synthetic task (an independent Philox stream, models/data/
// synthetic_tasks.h), or the files of run.eval_path for text and shards. The held-out loss is the
// token-weighted mean over run.eval_batches batches, computed exactly like the training loss (DP
// batches, CP shards). Exact match (synthetic) decodes greedily on run.eval_examples held-out
// prompts, split across every rank of the world, each rank running its full model replica alone.
#include <memory>
#include <optional>

#include "apps/config/config.h"
#include "apps/trainer/step/training_step.h"
#include "models/data/data_loader.h"
#include "models/data/exact_match.h"
#include "models/gpt.h"

namespace cpf::trainer {

// The synthetic task's eval split as a document source (held-out loss batches).
class EvalSplitSource : public models::data::DocumentSource {
 public:
  explicit EvalSplitSource(std::shared_ptr<const models::data::SyntheticSource> train);
  std::string name() const override { return train_->name() + " (eval split)"; }
  int64_t num_documents() const override { return kDocuments; }
  int64_t document_length(int64_t index) const override;
  models::data::Document document(int64_t index) const override;
  int64_t vocab_size() const override { return train_->vocab_size(); }
  int64_t eot_token() const override { return train_->eot_token(); }
  std::string decode(const std::vector<int64_t>& tokens) const override { return train_->decode(tokens); }

 private:
  static constexpr int64_t kDocuments = 100000;
  std::shared_ptr<const models::data::SyntheticSource> train_;
};

// The held-out source for `config` given the opened training source, or nullptr when there is none.
std::shared_ptr<const models::data::DocumentSource> make_eval_source(
    const TrainConfig& config, const std::shared_ptr<const models::data::DocumentSource>& train);

// Mean held-out loss; every rank of the world calls it. nullopt without held-out data.
std::optional<double> eval_loss(const models::GPT& model, const TrainConfig& config,
                                const std::shared_ptr<const models::data::DocumentSource>& eval_source,
                                const RankGroups& groups);

// The model's greedy next token after each prefix (no CP: the model replica of one rank).
std::vector<int64_t> greedy_next_tokens(const models::GPT& model, const std::vector<std::vector<int64_t>>& prefixes,
                                        int64_t context);

// Exact match over `num_examples` eval prompts; every rank of the world calls it and gets the total.
models::data::ExactMatchResult eval_exact_match(const models::GPT& model, const models::data::SyntheticSource& source,
                                                int64_t num_examples, const RankGroups& groups);

}  // namespace cpf::trainer
