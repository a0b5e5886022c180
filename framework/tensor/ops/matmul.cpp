#include "framework/tensor/ops/matmul.h"

#include <Eigen/Core>

#include "framework/tensor/cpu/strided_loop.h"
#include "framework/tensor/device_ops.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/views.h"
#include "framework/tensor/profile.h"
#include "framework/tensor/shape_utils.h"

namespace cpf::raw {
namespace {

template <class T>
using RowMajor = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using ColMajor = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;
using Stride = Eigen::OuterStride<>;

// A (rows, cols) matrix view maps onto Eigen without a copy as row-major when its column stride is 1
// and rows do not overlap, or column-major the other way round. A single row (column) only needs its
// column (row) stride to be positive: it becomes the outer stride. Anything else, e.g. the stride-0
// dims of an expanded tensor, is made contiguous first.
bool row_major_ok(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride) {
  return (col_stride == 1 && (rows <= 1 || row_stride >= cols)) || (cols <= 1 && row_stride >= 1);
}
bool col_major_ok(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride) {
  return (row_stride == 1 && (cols <= 1 || col_stride >= rows)) || (rows <= 1 && col_stride >= 1);
}
bool mappable(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride) {
  return (rows <= 1 && cols <= 1) || row_major_ok(rows, cols, row_stride, col_stride) ||
         col_major_ok(rows, cols, row_stride, col_stride);
}

// Calls fn(eigen_map) with the right storage order for the (mappable) matrix at `ptr`.
template <class T, class Fn>
void with_matrix(const T* ptr, int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride, Fn&& fn) {
  if (rows <= 1 && cols <= 1) {
    fn(Eigen::Map<const RowMajor<T>, 0, Stride>(ptr, rows, cols, Stride(1)));
  } else if (row_major_ok(rows, cols, row_stride, col_stride)) {
    // A single column walks rows through the outer stride (the inner one is never used).
    fn(Eigen::Map<const RowMajor<T>, 0, Stride>(ptr, rows, cols, Stride(rows <= 1 ? cols : row_stride)));
  } else {
    fn(Eigen::Map<const ColMajor<T>, 0, Stride>(ptr, rows, cols, Stride(cols <= 1 ? rows : col_stride)));
  }
}

template <class T>
void gemm_batched(const Tensor& a, const Tensor& b, const Tensor& out, const Shape& batch) {
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  const int64_t batch_count = shape_numel(batch);
  // Batch strides of a and b under broadcasting (0 along broadcast dims).
  auto batch_strides = [&](const Tensor& t) {
    Shape strides(batch.size(), 0);
    const int64_t lead = static_cast<int64_t>(batch.size()) - (t.dim() - 2);
    for (int64_t d = 0; d < t.dim() - 2; ++d) {
      if (t.size(d) != 1) strides[d + lead] = t.stride(d);
    }
    return strides;
  };
  const Shape sa = batch_strides(a), sb = batch_strides(b);
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  T* po = out.data<T>();
  auto offset_of = [&](int64_t index, const Shape& strides) {
    int64_t off = 0;
    for (int64_t d = static_cast<int64_t>(batch.size()) - 1; d >= 0; --d) {
      off += (index % batch[d]) * strides[d];
      index /= batch[d];
    }
    return off;
  };
  auto one = [&](int64_t i) {
    Eigen::Map<RowMajor<T>> c(po + i * m * n, m, n);
    with_matrix<T>(pa + offset_of(i, sa), m, k, a.stride(-2), a.stride(-1), [&](const auto& ma) {
      with_matrix<T>(pb + offset_of(i, sb), k, n, b.stride(-2), b.stride(-1),
                     [&](const auto& mb) { c.noalias() = ma * mb; });
    });
  };
  // Many small matrices: one per thread. Few large ones: Eigen threads the GEMM itself.
  const bool parallel_batches = batch_count >= cpu::max_threads() && m * n * k < (1 << 21);
  if (parallel_batches) {
#if defined(CPF_WITH_OPENMP)
#pragma omp parallel for schedule(static)
#endif
    for (int64_t i = 0; i < batch_count; ++i) one(i);
  } else {
    for (int64_t i = 0; i < batch_count; ++i) one(i);
  }
}

}  // namespace

void report_gemm_work(const Tensor& out, const Tensor& a, const Tensor& b, double extra_bytes) {
  if (!profile::enabled()) return;
  profile::add_work(2.0 * static_cast<double>(out.numel()) * static_cast<double>(a.size(-1)),
                    profile::tensor_bytes(a) + profile::tensor_bytes(b) + profile::tensor_bytes(out) + extra_bytes);
}

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  check_defined(a_in, "matmul", "a");
  check_defined(b_in, "matmul", "b");
  check_same_dtype(a_in, b_in, "matmul");
  check_same_device(a_in, b_in, "matmul");
  CPF_CHECK(has_kernel(a_in.device(), &DeviceOps::matmul), "matmul: no kernel for device ", a_in.device(),
            " in this build");
  CPF_CHECK(a_in.dim() >= 1 && b_in.dim() >= 1, "matmul: operands must have at least one dim, got a=", a_in.shape(),
            " b=", b_in.shape());
  CPF_CHECK(is_floating(a_in.dtype()), "matmul: needs floating tensors, got ", a_in.dtype());
  const bool a_vector = a_in.dim() == 1, b_vector = b_in.dim() == 1;
  Tensor a = a_vector ? unsqueeze(a_in, 0) : a_in;  // (1, K)
  Tensor b = b_vector ? unsqueeze(b_in, 1) : b_in;  // (K, 1)
  CPF_CHECK(a.size(-1) == b.size(-2), "matmul: inner dimensions differ: a=", a_in.shape(), " b=", b_in.shape());
  // bf16 on the CPU computes in f32; devices take bf16 operands as they are.
  if (a.dtype() == DType::bf16 && a.device().is_cpu()) {
    return to(matmul(to(a_in, DType::f32), to(b_in, DType::f32)), DType::bf16);
  }

  const Shape batch = broadcast_shapes(Shape(a.shape().begin(), a.shape().end() - 2),
                                       Shape(b.shape().begin(), b.shape().end() - 2), "matmul");
  if (!mappable(a.size(-2), a.size(-1), a.stride(-2), a.stride(-1))) a = contiguous(a);
  if (!mappable(b.size(-2), b.size(-1), b.stride(-2), b.stride(-1))) b = contiguous(b);
  Shape out_shape = batch;
  out_shape.push_back(a.size(-2));
  out_shape.push_back(b.size(-1));
  Tensor out = empty(out_shape, {.dtype = a.dtype(), .device = a.device()});
  if (out.numel() > 0) {
    if (a.size(-1) == 0) {
      zero_(out);
    } else {
      report_gemm_work(out, a, b);
      if (!out.device().is_cpu()) {
        device_kernel(out.device(), &DeviceOps::matmul, "matmul")(out, a, b);
      } else {
        visit_compute_dtype(a.dtype(), "matmul", [&]<class T>() { gemm_batched<T>(a, b, out, batch); });
      }
    }
  }
  if (a_vector) out = squeeze(out, -2);
  if (b_vector) out = squeeze(out, -1);
  return out;
}

}  // namespace cpf::raw
