#include "framework/optim/optimizer_snapshot.h"

#include "framework/core/error.h"
#include "framework/tensor/ops/views.h"

namespace cpf::optim {

OptimizerSnapshot::OptimizerSnapshot(std::string name, std::vector<ParamGroup> groups, std::vector<std::string> slots,
                                     const NamedTensors& state, int64_t step_count)
    : Optimizer(std::move(name), std::move(groups), std::move(slots), state, step_count) {}

std::unique_ptr<OptimizerSnapshot> OptimizerSnapshot::zeros_for(std::string name, std::vector<ParamGroup> groups,
                                                                std::vector<std::string> slots, bool allocate) {
  NamedTensors state;
  for (const std::string& slot : slots) {
    for (const ParamGroup& group : groups) {
      for (const auto& [pname, p] : group.params) {
        const TensorOptions options{.dtype = state_dtype(p.dtype()), .device = p.device()};
        // Zero-stride views of one element when only shapes matter (a checkpoint's validation).
        const Shape ones(static_cast<size_t>(p.dim()), 1);
        state.emplace_back(slot + "." + pname, allocate ? cpf::zeros(p.shape(), options)
                                                        : raw::expand(cpf::zeros(ones, options), p.shape()));
      }
    }
  }
  return std::make_unique<OptimizerSnapshot>(std::move(name), std::move(groups), std::move(slots), state, 0);
}

void OptimizerSnapshot::update(const Tensor&, const Tensor&, const std::vector<Tensor>&, double, int64_t) {
  CPF_FAIL("optimizer snapshot '", name(), "': a snapshot holds state for checkpoints and takes no step");
}

}  // namespace cpf::optim
