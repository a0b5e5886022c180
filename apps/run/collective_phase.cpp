#include "apps/run/collective_phase.h"

#include "framework/core/error.h"
#include "framework/tensor/tensor.h"

namespace cpf::trainer {

void run_collective_phase(dist::ProcessGroup& group, Device device, bool mine, const std::function<void()>& phase,
                          const std::string& elsewhere) {
  std::string error;
  if (mine) {
    try {
      phase();
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  // The max of the flags: 1 when any rank failed.
  const Tensor flag = full({1}, error.empty() ? 0.0 : 1.0, {.dtype = DType::f64, .device = device});
  if (group.all_reduce(flag, dist::ReduceOp::max).item<double>() == 0) return;
  CPF_CHECK(error.empty(), error);
  CPF_FAIL(elsewhere);
}

}  // namespace cpf::trainer
