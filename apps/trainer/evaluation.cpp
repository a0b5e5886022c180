#include "apps/trainer/evaluation.h"

#include <algorithm>

#include "framework/autograd/ops.h"
#include "models/gpt_input.h"

namespace cpf::trainer {

EvalSplitSource::EvalSplitSource(std::shared_ptr<const models::data::SyntheticSource> train)
    : train_(std::move(train)) {
  CPF_CHECK(train_ != nullptr, "EvalSplitSource: no synthetic source");
}

int64_t EvalSplitSource::document_length(int64_t index) const {
  const models::data::SyntheticExample ex = train_->example(index, models::data::Split::eval);
  return static_cast<int64_t>(ex.prompt.size() + ex.answer.size());
}

models::data::Document EvalSplitSource::document(int64_t index) const {
  models::data::check_document_index(*this, index);
  models::data::SyntheticExample ex = train_->example(index, models::data::Split::eval);
  models::data::Document doc;
  doc.prompt_length = static_cast<int64_t>(ex.prompt.size());
  doc.tokens = std::move(ex.prompt);
  doc.tokens.insert(doc.tokens.end(), ex.answer.begin(), ex.answer.end());
  return doc;
}

std::shared_ptr<const models::data::DocumentSource> make_eval_source(
    const TrainConfig& config, const std::shared_ptr<const models::data::DocumentSource>& train) {
  if (auto synthetic = std::dynamic_pointer_cast<const models::data::SyntheticSource>(train)) {
    return std::make_shared<EvalSplitSource>(synthetic);
  }
  if (config.run.eval_path.empty()) return nullptr;
  models::data::DataOptions options = config.data;
  options.path = config.run.eval_path;
  return models::data::make_document_source(options);
}

std::optional<double> eval_loss(const models::GPT& model, const TrainConfig& config,
                                const std::shared_ptr<const models::data::DocumentSource>& eval_source,
                                const RankGroups& g) {
  if (!eval_source || config.run.eval_batches == 0) return std::nullopt;
  NoGradGuard no_grad;
  models::data::DataOptions options = config.data;
  options.shuffle = false;  // the same held-out batches at every evaluation
  models::data::DataLoader loader(eval_source, options, g.dp_rank, g.dp_size);
  double weighted = 0;
  int64_t tokens = 0;
  for (int64_t i = 0; i < config.run.eval_batches; ++i) {
    const BatchLoss b = batch_loss(model, loader.next(), g);
    const Tensor loss = g.world && g.world->size() > 1 ? g.world->all_reduce(b.loss) : b.loss;
    weighted += loss.item<double>() * static_cast<double>(b.global_valid);
    tokens += b.global_valid;
  }
  if (tokens == 0) return std::nullopt;
  return weighted / static_cast<double>(tokens);
}

std::vector<int64_t> greedy_next_tokens(const models::GPT& model, const std::vector<std::vector<int64_t>>& prefixes,
                                        int64_t context) {
  NoGradGuard no_grad;
  std::vector<std::vector<int64_t>> cropped;
  for (const auto& p : prefixes) {
    const int64_t n = static_cast<int64_t>(p.size());
    cropped.emplace_back(p.begin() + std::max<int64_t>(0, n - context), p.end());
  }
  const Tensor logits = model.forward(models::make_prompt_input(cropped, model.device()));  // (T, V)
  const std::vector<int64_t> rows = models::last_token_rows(cropped);
  const Tensor row_index = from_vector(rows, {static_cast<int64_t>(rows.size())}, model.device());
  const Tensor last = index_select(logits, 0, row_index);  // (N, V)
  return argmax(last, 1).to_vector<int64_t>();
}

models::data::ExactMatchResult eval_exact_match(const models::GPT& model, const models::data::SyntheticSource& source,
                                                int64_t num_examples, const RankGroups& g) {
  const int64_t world = g.world ? g.world->size() : 1;
  const int64_t rank = g.world ? g.world->rank() : 0;
  const int64_t begin = num_examples * rank / world, end = num_examples * (rank + 1) / world;
  models::data::ExactMatchResult result;
  if (end > begin) {
    const int64_t context = model.options().positions == models::PositionType::learned
                                ? model.options().max_positions
                                : std::numeric_limits<int64_t>::max();
    auto predict = [&](const std::vector<std::vector<int64_t>>& prefixes) {
      return greedy_next_tokens(model, prefixes, context);
    };
    result = models::data::evaluate_exact_match_batched(source, predict, end - begin, 64, begin);
  }
  if (world > 1) {
    const Tensor counts = from_vector<int64_t>({result.num_correct}, {1}, model.device());  // the group's device
    result.num_correct = g.world->all_reduce(counts).to_vector<int64_t>()[0];
  }
  result.num_examples = num_examples;
  return result;
}

}  // namespace cpf::trainer
