#include "apps/config/accumulation.h"

#include <algorithm>

#include "framework/core/error.h"
#include "models/data/data_options.h"

namespace cpf::trainer {

int64_t micro_step_tokens(const TrainConfig& c) {
  return models::data::effective_tokens_per_batch(c.data) * c.parallel.dp;
}

std::optional<AccumulationProblem> accumulation_problem(const TrainConfig& c) {
  const int64_t total = c.data.total_batch_tokens;
  if (total == 0) return std::nullopt;
  const int64_t micro = micro_step_tokens(c);
  const std::string per_step = std::to_string(models::data::effective_tokens_per_batch(c.data)) +
                               " tokens per batch x " + "parallel.dp=" + std::to_string(c.parallel.dp) + " = " +
                               std::to_string(micro);
  if (total % micro != 0) {
    const int64_t lower = std::max<int64_t>(total / micro, 1) * micro;
    return AccumulationProblem{"data.total_batch_tokens", "must be a multiple of the tokens of one micro-step (" +
                                                              per_step + "); use " + std::to_string(lower) +
                                                              ", or change data.batch_size / data.seq_len"};
  }
  const int64_t steps = total / micro;
  if (c.run.grad_accum_steps != 1 && c.run.grad_accum_steps != steps) {
    return AccumulationProblem{"run.grad_accum_steps",
                               "disagrees with data.total_batch_tokens=" + std::to_string(total) + " (" + per_step +
                                   " per micro-step gives " + std::to_string(steps) +
                                   " micro-steps); set only one of the two"};
  }
  return std::nullopt;
}

int64_t grad_accum_steps(const TrainConfig& c) {
  if (auto p = accumulation_problem(c)) CPF_FAIL(p->key, ": ", p->problem);
  return c.data.total_batch_tokens > 0 ? c.data.total_batch_tokens / micro_step_tokens(c) : c.run.grad_accum_steps;
}

}  // namespace cpf::trainer
