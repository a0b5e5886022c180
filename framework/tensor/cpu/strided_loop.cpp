#include "framework/tensor/cpu/strided_loop.h"

#if defined(CPF_WITH_OPENMP)
#include <omp.h>
#endif

#include "framework/tensor/shape_utils.h"

namespace cpf::cpu {

int max_threads() {
#if defined(CPF_WITH_OPENMP)
  return omp_get_max_threads();
#else
  return 1;
#endif
}

std::vector<int64_t> broadcast_strides(const Tensor& t, const Shape& shape) {
  CPF_CHECK(static_cast<size_t>(t.dim()) <= shape.size(), "broadcast: tensor of shape ", t.shape(),
            " has more dims than the iteration shape ", shape);
  std::vector<int64_t> strides(shape.size(), 0);
  const size_t lead = shape.size() - static_cast<size_t>(t.dim());
  for (size_t d = 0; d < static_cast<size_t>(t.dim()); ++d) {
    const int64_t size = t.shape()[d];
    CPF_CHECK(size == shape[d + lead] || size == 1, "broadcast: shape ", t.shape(), " does not broadcast to ", shape);
    strides[d + lead] = size == 1 ? 0 : t.strides()[d];
  }
  return strides;
}

}  // namespace cpf::cpu
