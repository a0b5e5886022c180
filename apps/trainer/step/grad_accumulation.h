#pragma once
// Gradient accumulation: one optimizer step over several micro-batches (llm.c's "total batch size").
//
// Each DP rank runs run.grad_accum_steps micro-batches per step, each the usual data batch
// (data.batch_size rows, or data.tokens_per_batch tokens). data.total_batch_tokens sets the count from a
// total instead:  grad_accum_steps = total_batch_tokens / (tokens per batch x parallel.dp).
//
// Exactness: the valid labels of every micro-batch of every rank are counted before the first forward,
// and each micro-batch's summed token loss is divided by that total. The gradients that accumulate in
// .grad, and the summed loss, are then those of the mean over one batch holding all the micro-batches;
// only the order of the float additions differs. DP ranks all-reduce the gradients once, in the last
// micro-batch's backward (GradientReducer::set_sync); CP ranks shard every micro-batch as usual. With
// several ranks the training step counts them a step ahead (step_prefetch.h) and passes the total in.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "apps/config/accumulation.h"
#include "apps/config/config.h"
#include "apps/trainer/step/training_step.h"
#include "framework/distributed/grad_reducer.h"

namespace cpf::trainer {

struct AccumulatedLoss {
  double loss = 0;           // mean token loss of the whole step (every rank gets it); 0 unless read_loss
  int64_t valid_labels = 0;  // labels of the whole step over the world
  Tensor loss_tensor;        // () the same loss on the model's device, what `loss` is read from
};

// Forward and backward of this rank's micro-batches of one step, accumulating into the parameters'
// .grad (which the caller zeroes after the optimizer step). `reducer` (null on one rank) has its sync
// off for every micro-batch but the last, and is finished before returning.
// read_loss false: the loss is left on the device (the training step reads it back with the gradient norm).
// world_valid_labels: the world's valid labels of these micro-batches when already agreed (a step ahead,
// step_prefetch.h); nullopt: counted here, with a blocking all-reduce when there are several ranks.
AccumulatedLoss accumulate_gradients(const models::GPT& model, const std::vector<models::data::Batch>& micro_batches,
                                     const RankGroups& groups, dist::GradientReducer* reducer, bool read_loss = true,
                                     std::optional<int64_t> world_valid_labels = std::nullopt);

}  // namespace cpf::trainer
