#include "framework/tensor/ops/embedding.h"

#include <Eigen/Core>
#include <algorithm>
#include <cstring>
#include <vector>

#include "framework/tensor/cpu/compute_types.h"
#include "framework/tensor/cpu/strided_loop.h"
#include "framework/tensor/device_ops.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/embedding_segment.h"
#include "framework/tensor/ops/views.h"
#include "framework/tensor/shape_utils.h"

namespace cpf::raw {
namespace {

void check_ids(const Tensor& ids, const char* op) {
  check_defined(ids, op, "ids");
  CPF_CHECK(has_kernel(ids.device(), &DeviceOps::gather), op, ": no kernel for device ", ids.device(),
            " in this build");
  CPF_CHECK(ids.dtype() == DType::i32 || ids.dtype() == DType::i64, op, ": ids must be i32 or i64, got ", ids.dtype());
}

// Every id of a contiguous device ids tensor must be a row of the table, checked on the device: a bad
// id is raised at the next synchronisation (framework/tensor/cuda/cuda.h), so nothing waits here.
void check_ids_on_device(const Tensor& ids, int64_t rows, const char* op) {
  DeviceIndexCheck check;
  check.kind = DeviceIndexKind::embedding_id;
  check.op = op;
  check.index = ids;
  check.bound = rows;
  device_kernel(ids.device(), &DeviceOps::check_indices, op)(check);
}

// Multi-index of a row-major flat index, for error messages.
Shape unravel(int64_t flat, const Shape& shape) {
  Shape index(shape.size());
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    index[d] = flat % shape[d];
    flat /= shape[d];
  }
  return index;
}

// Every id of a contiguous ids buffer must be a row of the table.
template <class I>
void check_range(const I* ids, const Shape& shape, int64_t rows, const char* op) {
  const int64_t n = shape_numel(shape);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = static_cast<int64_t>(ids[i]);
    CPF_CHECK(id >= 0 && id < rows, op, ": id ", id, " at position ", unravel(i, shape), " of ids ", shape,
              " is out of range for a table of V=", rows, " rows (expected 0..", rows - 1, ")");
  }
}

template <class Fn>
void visit_id_type(DType dtype, Fn&& fn) {
  if (dtype == DType::i32) {
    fn.template operator()<int32_t>();
  } else {
    fn.template operator()<int64_t>();
  }
}

// The ids seen more than kEmbeddingSegment times, each with a slot for its running segment sum
// (slot[v] = -1 for the others).
template <class I>
std::vector<int64_t> long_id_slots(const I* id, int64_t n, int64_t rows, std::vector<int64_t>& long_ids) {
  std::vector<int64_t> count(static_cast<size_t>(rows), 0), slot(static_cast<size_t>(rows), -1);
  for (int64_t i = 0; i < n; ++i) ++count[static_cast<size_t>(id[i])];
  for (int64_t v = 0; v < rows; ++v) {
    if (count[static_cast<size_t>(v)] <= kEmbeddingSegment) continue;
    slot[static_cast<size_t>(v)] = static_cast<int64_t>(long_ids.size());
    long_ids.push_back(v);
  }
  return slot;
}

// out[:, c0:c0+w] += the grad rows in the order of embedding_segment.h: a short id's rows added in
// position order; a long id's rows summed from 0 per segment, each finished segment's sum added to out.
template <class T, class I>
void add_rows_segmented(const T* g, const I* id, T* o, int64_t n, int64_t cols, int64_t c0, int64_t w,
                        const std::vector<int64_t>& slot, const std::vector<int64_t>& long_ids) {
  std::vector<T> partial(long_ids.size() * static_cast<size_t>(w), T(0));  // (long ids, w)
  std::vector<int64_t> seen(long_ids.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = static_cast<int64_t>(id[i]);
    Eigen::Map<Vec<T>> dst(o + v * cols + c0, w);
    const Eigen::Map<const Vec<T>> src(g + i * cols + c0, w);
    const int64_t s = slot[static_cast<size_t>(v)];
    if (s < 0) {
      dst += src;
      continue;
    }
    Eigen::Map<Vec<T>> p(partial.data() + s * w, w);
    if (seen[s] > 0 && seen[s] % kEmbeddingSegment == 0) {
      dst += p;  // the first time 0 + sum: the sum itself, as the device takes it
      p.setZero();
    }
    p += src;
    ++seen[s];
  }
  for (size_t s = 0; s < long_ids.size(); ++s) {
    Eigen::Map<Vec<T>>(o + long_ids[s] * cols + c0, w) += Eigen::Map<Vec<T>>(partial.data() + s * w, w);
  }
}

}  // namespace

Tensor embedding(const Tensor& weight, const Tensor& ids) {
  const char* op = "embedding";
  check_defined(weight, op, "weight");
  CPF_CHECK(has_kernel(weight.device(), &DeviceOps::gather), op, ": no kernel for device ", weight.device(),
            " in this build");
  CPF_CHECK(is_floating(weight.dtype()), op, ": weight must be a floating tensor, got ", weight.dtype());
  CPF_CHECK(weight.dim() == 2, op, ": weight must be 2-D (V, C), got shape ", weight.shape());
  check_ids(ids, op);
  check_same_device(weight, ids, op);
  const int64_t rows = weight.size(0), cols = weight.size(1);
  const Tensor idc = contiguous(ids);
  if (!weight.device().is_cpu()) {
    check_ids_on_device(idc, rows, op);
    Shape shape = ids.shape();
    shape.push_back(cols);
    Tensor out = empty(shape, {.dtype = weight.dtype(), .device = weight.device()});
    const int64_t n = ids.numel();
    if (out.numel() > 0) {
      device_kernel(weight.device(), &DeviceOps::gather, op)(reshape(out, {n, cols}), weight, 0, reshape(idc, {n}),
                                                             true);
    }
    return out;
  }
  // Rows are copied whole, so only the inner stride has to be 1 (a row-sliced table needs no copy).
  const Tensor table = weight.stride(1) == 1 || cols <= 1 ? weight : contiguous(weight);
  Shape out_shape = ids.shape();
  out_shape.push_back(cols);
  Tensor out = empty(out_shape, {.dtype = weight.dtype()});
  const int64_t n = ids.numel();
  const size_t elem = dtype_size(weight.dtype());
  const size_t row_bytes = static_cast<size_t>(cols) * elem;
  const size_t table_row_bytes = static_cast<size_t>(table.stride(0)) * elem;
  const bool parallel = n > 1 && n * cols >= cpu::kParallelGrain;
  visit_id_type(idc.dtype(), [&]<class I>() {
    const I* id = idc.data<I>();
    check_range(id, ids.shape(), rows, op);
    if (row_bytes == 0) return;
    const char* src = static_cast<const char*>(table.raw_data());
    char* dst = static_cast<char*>(out.raw_data());
#if defined(CPF_WITH_OPENMP)
#pragma omp parallel for if (parallel) schedule(static)
#endif
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(dst + static_cast<size_t>(i) * row_bytes, src + static_cast<size_t>(id[i]) * table_row_bytes,
                  row_bytes);
    }
  });
  return out;
}

Tensor embedding_backward(const Tensor& grad, const Tensor& ids, int64_t num_rows) {
  const char* op = "embedding_backward";
  check_defined(grad, op, "grad");
  CPF_CHECK(has_kernel(grad.device(), &DeviceOps::embedding_backward), op, ": no kernel for device ", grad.device(),
            " in this build");
  CPF_CHECK(is_floating(grad.dtype()), op, ": grad must be a floating tensor, got ", grad.dtype());
  check_ids(ids, op);
  CPF_CHECK(num_rows >= 0, op, ": num_rows must be >= 0, got ", num_rows);
  check_same_device(grad, ids, op);
  const bool shape_ok =
      grad.dim() == ids.dim() + 1 && std::equal(ids.shape().begin(), ids.shape().end(), grad.shape().begin());
  CPF_CHECK(shape_ok, op, ": grad of shape ", grad.shape(), " must be ids' shape ", ids.shape(),
            " followed by the embedding dim");
  const int64_t cols = grad.size(-1);
  const DType compute = compute_dtype(grad.dtype());
  if (!grad.device().is_cpu()) {
    // Sorted by id on the device (embedding_backward.cu): no copy to the host, cost in the tokens.
    const Tensor idc = contiguous(ids);
    check_ids_on_device(idc, num_rows, op);
    const int64_t n = ids.numel();
    Tensor out = empty({num_rows, cols}, {.dtype = compute, .device = grad.device()});
    device_kernel(grad.device(), &DeviceOps::embedding_backward, op)(out, reshape(contiguous(grad), {n, cols}),
                                                                     reshape(idc, {n}));
    return to(out, grad.dtype());
  }
  const Tensor gc = contiguous(to(grad, compute));
  const Tensor idc = contiguous(ids);
  Tensor out = zeros({num_rows, cols}, {.dtype = compute});
  const int64_t n = ids.numel();
  const bool parallel = n * cols >= cpu::kParallelGrain;
  // Each task owns a group of columns and adds the rows of grad in the order of embedding_segment.h: a
  // fixed summation order per element that does not depend on the thread count (the device's).
  const int64_t group = cpu::column_group(cols, parallel);
  const int64_t groups = (cols + group - 1) / group;
  visit_id_type(idc.dtype(), [&]<class I>() {
    const I* id = idc.data<I>();
    check_range(id, ids.shape(), num_rows, op);
    std::vector<int64_t> long_ids;
    const std::vector<int64_t> slot = long_id_slots(id, n, num_rows, long_ids);
    visit_compute_dtype(compute, op, [&]<class T>() {
      const T* g = gc.data<T>();
      T* o = out.data<T>();
#if defined(CPF_WITH_OPENMP)
#pragma omp parallel for if (parallel && groups > 1) schedule(static)
#endif
      for (int64_t k = 0; k < groups; ++k) {
        const int64_t c0 = k * group;
        const int64_t w = std::min(group, cols - c0);
        add_rows_segmented(g, id, o, n, cols, c0, w, slot, long_ids);
      }
    });
  });
  return to(out, grad.dtype());
}

}  // namespace cpf::raw
