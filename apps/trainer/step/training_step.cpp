#include "apps/trainer/step/training_step.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "apps/trainer/step/grad_accumulation.h"
#include "apps/trainer/step/step_graph.h"
#include "apps/trainer/step/step_prefetch.h"
#include "apps/trainer/step/step_readback.h"
#include "apps/trainer/step/step_window.h"
#include "framework/autograd/ops.h"
#include "framework/optim/grad_clip.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/profile.h"
#include "models/data/cp_shard.h"
#include "models/gpt_input.h"

namespace cpf::trainer {

BatchLoss batch_loss(const models::GPT& model, const models::data::Batch& batch, const RankGroups& g) {
  const models::data::LocalBatch local = models::data::shard_for_rank(batch, g.cp_size, g.cp_rank);
  const models::GPTBatch b = models::to_device(models::make_gpt_batch(local), model.device());
  int64_t count = b.num_valid_labels;
  if (g.world && g.world->size() > 1) {
    // On the model's device: an NCCL group only takes tensors on its GPU.
    count =
        g.world->all_reduce(scalar_tensor(static_cast<double>(count), {.dtype = DType::i64, .device = model.device()}))
            .item<int64_t>();
  }
  // The fused classifier (no (T, V) logits), as training computes it; under NoGradGuard the loss alone.
  return BatchLoss{.loss = model.forward_loss(b.input, b.labels, std::max<int64_t>(count, 1), b.num_valid_labels,
                                              g.cp ? &*g.cp : nullptr),
                   .global_valid = count};
}

namespace {

// This step's micro-batches: read a step ahead with their world label count when `p.prefetch` holds them.
StepPrefetch::Taken take_micro_batches(const StepParts& p, StepResult& result) {
  const profile::Scope data_scope("phase/data", p.model.device());
  StepPrefetch::Taken taken;
  if (p.prefetch) {
    taken = p.prefetch->take(p.loader, p.accum_steps);
  } else {
    for (int64_t i = 0; i < p.accum_steps; ++i) taken.micro_batches.push_back(p.loader.next());
  }
  for (const models::data::Batch& b : taken.micro_batches) result.tokens += b.tokens.numel() * p.groups.dp_size;
  return taken;
}

// The step up to its gradients: the micro-batches forward and backward, the prefetch of the next step's
// values (several ranks).
struct Enqueued {
  Tensor loss;  // () the step's loss on the model's device
  std::vector<Tensor> ahead;
};

Enqueued enqueue_gradients(const StepParts& p, int64_t step, StepResult& result) {
  // run.grad_accum_steps micro-batches, accumulated exactly as one batch (grad_accumulation.h); each
  // micro-batch's loss is divided by the step's token count over the world, so the sum is the mean.
  const Device device = p.model.device();
  const StepPrefetch::Taken taken = take_micro_batches(p, result);
  // run.precision: fp8: each weight cast once for all the step's forwards, recomputes and micro-batches;
  // the copies go when the scope closes, before the optimizer changes the weights (fp8_weight_cache.h).
  const Fp8WeightCache::StepScope fp8_weights(p.model.fp8_weight_cache());
  const AccumulatedLoss accumulated =
      p.graph ? p.graph->accumulate(p.model, taken.micro_batches, p.groups, p.params, step)
              : accumulate_gradients(p.model, taken.micro_batches, p.groups, p.reducer, false, taken.valid_labels);
  Enqueued e;
  if (p.prefetch) {
    // Several ranks: the next step's world label count and the agreed stop signal, all-reduced behind
    // this step's gradients and read at this step's event (step_prefetch.h); the host reads the next
    // step's data while the GPU runs the backward.
    const profile::Scope data_scope("phase/data", device);
    e.ahead = p.prefetch->read_ahead(p.loader, p.accum_steps, p.groups, device);
  }
  e.loss = accumulated.loss_tensor;
  return e;
}

// The gradients' sum of squares, (1) f64 on their device: of every parameter, or (sharded) of this rank's
// pieces all-reduced over the world.
Tensor step_sum_squares(const StepParts& p) {
  if (!p.shards) return optim::grad_sum_squares(p.params);
  p.shards->take_gradients(*p.reducer);
  return p.shards->grad_sum_squares();
}

// Clipping (decided on the device by the sum) and the learning rate of step `step`.
void clip_and_set_lr(const StepParts& p, int64_t step, const Tensor& sum_squares) {
  if (p.grad_clip > 0) {
    optim::clip_grads_by_sum_squares_(p.shards ? p.shards->pieces() : p.params, sum_squares, p.grad_clip);
  }
  p.optimizer.set_lr(p.schedule.lr_at(step));
}

}  // namespace

void check_same_fp8_sites(dist::ProcessGroup& world, Fp8ScalingState& state, Device device) {
  const auto slots = static_cast<double>(state.keys().size());
  const Tensor mine = from_vector(std::vector<double>{slots, state.keys_fingerprint()}, {2});
  const Tensor on_device = raw::to(mine, device);
  const std::vector<double> lo = world.all_reduce(on_device, dist::ReduceOp::min).to_vector<double>();
  const std::vector<double> hi = world.all_reduce(on_device, dist::ReduceOp::max).to_vector<double>();
  CPF_CHECK(lo == hi, "fp8: the ranks made different FP8 call sites (", lo[0], " to ", hi[0],
            " slots, or in another order); every rank must run the same model");
  state.set_agreed_slots(static_cast<int64_t>(slots));
}

namespace {

// run.precision: fp8, delayed scaling: every rank's recorded amaxes reduced to their max over the world (so
// that all ranks derive the same scales), then every scale updated on the device; a step whose gradient
// norm is not finite (skipped by the optimizer) drops its amaxes (framework/autograd/fp8_scaling.h).
void update_fp8_scaling(const StepParts& p, const Tensor& sum_squares) {
  Fp8ScalingState* state = p.model.fp8_scaling();
  if (state == nullptr) return;
  if (p.groups.world && p.groups.world->size() > 1) {
    const auto slots = static_cast<int64_t>(state->keys().size());
    if (slots != state->agreed_slots()) check_same_fp8_sites(*p.groups.world, *state, p.model.device());
    for (const Tensor& amax : state->amax_buffers()) p.groups.world->all_reduce_(amax, dist::ReduceOp::max);
  }
  state->update(sum_squares);
}

// After the update: sharded, every parameter whole again from its owners, and every gradient dropped.
void finish_update(const StepParts& p) {
  if (p.shards) {
    p.shards->gather_parameters();
    p.shards->zero_grad();
  }
  p.optimizer.zero_grad();
}

}  // namespace

StepResult training_step(const StepParts& p, int64_t step) {
  // The profiler's scopes (step_profiler.h): NVTX ranges always, times while run.profile records.
  const Device device = p.model.device();
  const profile::Scope step_scope("step", device);
  StepResult result;
  const Enqueued e = enqueue_gradients(p, step, result);
  if (p.shards) p.shards->release_all();  // sharded parameters: the root the forward kept for the backward
  const profile::Scope optimizer_scope("phase/optimizer", device);
  const Tensor sum_squares = step_sum_squares(p);  // (1) f64 on the gradients' device
  // The whole optimizer phase is enqueued before anything is read back (docs/training.md, "Host
  // synchronisation in a step"): the norm stays a device sum of squares, clipping and the skip of a
  // non-finite norm are decided by the kernels that read it, and the host waits only for the copies of
  // the sum and the loss, recorded before the clip and AdamW kernels, which then overlap the host's work.
  std::vector<Tensor> values = {sum_squares, e.loss};
  values.insert(values.end(), e.ahead.begin(), e.ahead.end());
  StepReadback& readback = StepReadback::for_device(device);
  readback.enqueue(values);
  clip_and_set_lr(p, step, sum_squares);
  // Enqueued as applied (t + 1 in AdamW's bias corrections); the step count moves at commit.
  p.optimizer.step(sum_squares);
  finish_update(p);
  update_fp8_scaling(p, sum_squares);
  std::vector<double> read;
  try {
    read = readback.wait();  // device errors of the step (e.g. a bad token id) are reported here
  } catch (...) {
    p.optimizer.abandon();  // the optimizer stays usable; whether the update landed is unknown
    throw;
  }
  result.grad_norm = std::sqrt(read[0]);
  result.loss = read[1];
  result.skipped = !std::isfinite(result.grad_norm);
  p.optimizer.commit(!result.skipped);
  if (p.prefetch) p.prefetch->complete(read[2], read[3]);
  return result;
}

void training_step_deferred(const StepParts& p, int64_t step, StepWindow& window) {
  CPF_CHECK(p.prefetch == nullptr, "training_step_deferred: several ranks read each step back (step_prefetch.h)");
  const Device device = p.model.device();
  const profile::Scope step_scope("step", device);
  StepResult result;
  const Enqueued e = enqueue_gradients(p, step, result);
  if (p.shards) p.shards->release_all();  // sharded parameters: the root the forward kept for the backward
  const profile::Scope optimizer_scope("phase/optimizer", device);
  const Tensor sum_squares = optim::grad_sum_squares(p.params);  // (1) f64 on the gradients' device
  // Nothing is read back: the sum and the loss wait in the window's slot (device to device), the
  // optimizer numbers the step on the device (Optimizer::step_deferred) and the trainer settles it
  // when it reads the window.
  window.add(sum_squares, e.loss, result.tokens);
  clip_and_set_lr(p, step, sum_squares);
  p.optimizer.step_deferred(sum_squares);
  p.optimizer.zero_grad();
  update_fp8_scaling(p, sum_squares);
}

}  // namespace cpf::trainer
