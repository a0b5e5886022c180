#pragma once
// Row-major flat index <-> multi-index, for naive references in tests.
#include <cstdint>

#include "framework/tensor/tensor.h"

namespace cpf::testing {

inline Shape unravel(int64_t flat, const Shape& shape) {
  Shape idx(shape.size());
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    idx[d] = flat % shape[d];
    flat /= shape[d];
  }
  return idx;
}

inline int64_t ravel(const Shape& idx, const Shape& shape) {
  int64_t flat = 0;
  for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + idx[d];
  return flat;
}

}  // namespace cpf::testing
