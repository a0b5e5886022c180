#include "apps/trainer/step/grad_accumulation.h"

#include "framework/autograd/ops.h"
#include "framework/tensor/profile.h"
#include "models/data/cp_shard.h"
#include "models/gpt_input.h"

namespace cpf::trainer {
namespace {

// Labels of all micro-batches over the world. Every CP rank holds its DP rank's whole batch (whose
// num_valid_labels counts the CP group's labels), so the world sum counts each group cp_size times.
int64_t step_valid_labels(const std::vector<models::data::Batch>& micro_batches, const RankGroups& g, Device device) {
  int64_t local = 0;
  for (const models::data::Batch& b : micro_batches) local += b.num_valid_labels;
  if (!g.world || g.world->size() == 1) return local;
  const Tensor count = scalar_tensor(static_cast<double>(local), {.dtype = DType::i64, .device = device});
  return g.world->all_reduce(count).item<int64_t>() / g.cp_size;
}

}  // namespace

AccumulatedLoss accumulate_gradients(const models::GPT& model, const std::vector<models::data::Batch>& micro_batches,
                                     const RankGroups& g, dist::GradientReducer* reducer, bool read_loss,
                                     std::optional<int64_t> world_valid_labels) {
  CPF_CHECK(!micro_batches.empty(), "accumulate_gradients: no micro-batch");
  CPF_CHECK(!world_valid_labels || *world_valid_labels >= 0,
            "accumulate_gradients: world_valid_labels=", world_valid_labels.value_or(0), " is negative");
  AccumulatedLoss result;
  result.valid_labels = world_valid_labels ? *world_valid_labels : step_valid_labels(micro_batches, g, model.device());
  const int64_t normalizer = std::max<int64_t>(result.valid_labels, 1);
  Tensor step_loss;
  for (size_t i = 0; i < micro_batches.size(); ++i) {
    const bool last = i + 1 == micro_batches.size();
    if (reducer) reducer->set_sync(last);  // one all-reduce of the accumulated gradients per step
    const models::data::LocalBatch local = models::data::shard_for_rank(micro_batches[i], g.cp_size, g.cp_rank);
    const models::GPTBatch b = models::to_device(models::make_gpt_batch(local), model.device());
    Tensor loss;
    {
      const profile::Scope forward("phase/forward", model.device());
      // The fused LM head + loss (no whole logits; the head's gradients computed here, see GPT::forward_loss).
      loss = model.forward_loss(b.input, b.labels, normalizer, b.num_valid_labels, g.cp ? &*g.cp : nullptr);
    }
    {
      const profile::Scope backward_scope("phase/backward", model.device());
      backward(loss);
    }
    step_loss = step_loss.defined() ? add(step_loss, loss.detach()) : loss.detach();
  }
  if (reducer) {
    const profile::Scope sync("phase/grad_sync", model.device());
    reducer->finish();
  }
  const bool distributed = g.world && g.world->size() > 1;
  result.loss_tensor = distributed ? g.world->all_reduce(step_loss) : step_loss;
  if (read_loss) result.loss = result.loss_tensor.item<double>();
  return result;
}

}  // namespace cpf::trainer
