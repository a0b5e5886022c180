#pragma once
// How many micro-batches make one optimizer step (run.grad_accum_steps, data.total_batch_tokens): the
// config arithmetic of gradient accumulation, which the config reader checks and the training step
// (apps/trainer/step/grad_accumulation.h) runs.
#include <cstdint>
#include <optional>
#include <string>

#include "apps/config/config.h"

namespace cpf::trainer {

// Storage tokens one micro-step processes over the world: tokens per batch and DP rank x parallel.dp.
int64_t micro_step_tokens(const TrainConfig& config);

// The config's problem with accumulation as {key, "problem"} (for the config reader's file:line:column
// message), or nullopt: data.total_batch_tokens not a multiple of micro_step_tokens, or disagreeing with
// an explicit run.grad_accum_steps.
struct AccumulationProblem {
  std::string key;
  std::string problem;
};
std::optional<AccumulationProblem> accumulation_problem(const TrainConfig& config);

// Micro-batches per optimizer step (>= 1). Throws Error with the problem above.
int64_t grad_accum_steps(const TrainConfig& config);

}  // namespace cpf::trainer
