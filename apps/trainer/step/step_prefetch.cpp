#include "apps/trainer/step/step_prefetch.h"

#include <utility>

namespace cpf::trainer {

StepPrefetch::StepPrefetch(SignalSource stop_signal) : stop_signal_(stop_signal) {
  CPF_CHECK(stop_signal_ != nullptr, "StepPrefetch: no stop-signal source (pass pending_stop_signal)");
}

StepPrefetch::Taken StepPrefetch::take(models::data::DataLoader& loader, int64_t accum_steps) {
  CPF_CHECK(accum_steps >= 1, "StepPrefetch::take: accum_steps=", accum_steps, " must be at least 1");
  std::optional<Ahead> ahead = std::exchange(ahead_, std::nullopt);
  pending_ = false;
  Taken taken;
  // Valid only when counted (the step that read it ahead completed) and nothing moved the cursor since.
  if (ahead && ahead->valid_labels && loader.cursor() == ahead->from &&
      static_cast<int64_t>(ahead->micro_batches.size()) == accum_steps) {
    loader.set_cursor(ahead->to);
    taken.micro_batches = std::move(ahead->micro_batches);
    taken.valid_labels = ahead->valid_labels;
    return taken;
  }
  for (int64_t i = 0; i < accum_steps; ++i) taken.micro_batches.push_back(loader.next());
  return taken;
}

std::vector<Tensor> StepPrefetch::read_ahead(models::data::DataLoader& loader, int64_t accum_steps, const RankGroups& g,
                                             Device device) {
  CPF_CHECK(g.world && g.world->size() > 1, "StepPrefetch::read_ahead: a world of one rank has nothing to agree on");
  CPF_CHECK(accum_steps >= 1, "StepPrefetch::read_ahead: accum_steps=", accum_steps, " must be at least 1");
  Ahead ahead;
  ahead.from = loader.cursor();
  ahead.cp_size = g.cp_size;
  int64_t local = 0;
  try {
    for (int64_t i = 0; i < accum_steps; ++i) {
      ahead.micro_batches.push_back(loader.next());
      local += ahead.micro_batches.back().num_valid_labels;
    }
  } catch (...) {
    loader.set_cursor(ahead.from);  // the loader stays at the next unconsumed batch
    throw;
  }
  ahead.to = loader.cursor();
  loader.set_cursor(ahead.from);
  ahead_ = std::move(ahead);
  pending_ = true;
  // On the model's device (an NCCL group only takes tensors on its GPU); uploads that do not wait.
  const Tensor count = scalar_tensor(static_cast<double>(local), {.dtype = DType::f64, .device = device});
  const Tensor flag = scalar_tensor(static_cast<double>(stop_signal_()), {.dtype = DType::f64, .device = device});
  return {g.world->all_reduce(count), g.world->all_reduce(flag, dist::ReduceOp::max)};
}

void StepPrefetch::complete(double world_labels, double stop_signal) {
  CPF_CHECK(pending_ && ahead_, "StepPrefetch::complete: no read-ahead is pending (call read_ahead first)");
  pending_ = false;
  // Every CP rank of a DP group counted that group's whole batches: the world sum holds each cp_size times.
  ahead_->valid_labels = static_cast<int64_t>(world_labels) / ahead_->cp_size;
  agreed_signal_ = static_cast<int>(stop_signal);
}

std::optional<int> StepPrefetch::take_agreed_stop_signal() { return std::exchange(agreed_signal_, std::nullopt); }

}  // namespace cpf::trainer
