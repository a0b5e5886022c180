#pragma once
// An optimizer's state held without the optimizer: the tensors a checkpoint stores
// (Optimizer::state_tensors) under the optimizer's name and step count, for parameters the snapshot
// does not update. A run whose state is sharded over ranks (framework/distributed/zero_shards.h) saves
// through a snapshot of the gathered state and loads into one before handing each rank its part, so its
// checkpoints are the replicated run's, whatever the world size or shard stage (framework/io/checkpoint.h
// takes it as any Optimizer).
#include <memory>
#include <string>
#include <vector>

#include "framework/optim/optimizer.h"

namespace cpf::optim {

class OptimizerSnapshot final : public Optimizer {
 public:
  // `state`: "<slot>.<parameter name>" for every slot and parameter of `groups` (adopted, not copied).
  OptimizerSnapshot(std::string name, std::vector<ParamGroup> groups, std::vector<std::string> slots,
                    const NamedTensors& state, int64_t step_count);
  // A snapshot of `name`'s state shape for `params` grouped as `groups`, zero-filled: what a checkpoint is
  // loaded into. `allocate` false gives zero-stride views (no memory), enough to validate a checkpoint.
  static std::unique_ptr<OptimizerSnapshot> zeros_for(std::string name, std::vector<ParamGroup> groups,
                                                      std::vector<std::string> slots, bool allocate);

 protected:
  void update(const Tensor& param, const Tensor& grad, const std::vector<Tensor>& state, double weight_decay,
              int64_t step) override;
};

}  // namespace cpf::optim
