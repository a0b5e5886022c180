#include "framework/tensor/ops/cross_entropy.h"

#include <Eigen/Core>
#include <cmath>
#include <limits>
#include <vector>

#include "framework/tensor/cpu/compute_types.h"
#include "framework/tensor/cpu/softmax_kernels.h"
#include "framework/tensor/cpu/strided_loop.h"
#include "framework/tensor/device_ops.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/shape_utils.h"

namespace cpf::raw {
namespace {

void check_inputs(const Tensor& logits, const Tensor& targets, const char* op) {
  check_defined(logits, op, "logits");
  CPF_CHECK(has_kernel(logits.device(), &DeviceOps::cross_entropy), op, ": no kernel for device ", logits.device(),
            " in this build");
  CPF_CHECK(is_floating(logits.dtype()), op, ": logits must be a floating tensor, got ", logits.dtype());
  CPF_CHECK(logits.dim() == 2, op, ": logits must be 2-D (N, C), got shape ", logits.shape(),
            " (flatten the leading dims first)");
  CPF_CHECK(logits.size(1) > 0, op, ": logits need at least one class, got shape ", logits.shape());
  check_defined(targets, op, "targets");
  CPF_CHECK(targets.device() == logits.device(), op, ": targets are on ", targets.device(), " but logits are on ",
            logits.device());
  CPF_CHECK(targets.dtype() == DType::i32 || targets.dtype() == DType::i64, op, ": targets must be i32 or i64, got ",
            targets.dtype());
  CPF_CHECK(targets.shape() == Shape{logits.size(0)}, op, ": targets must have shape [", logits.size(0),
            "] to match logits ", logits.shape(), ", got ", targets.shape());
}

// What both backward forms need: check_inputs, a one-element floating grad_loss and the forward's
// compute-type lse of one value per row on the logits' device.
void check_backward_inputs(const Tensor& grad_loss, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                           const char* op) {
  check_inputs(logits, targets, op);
  check_defined(grad_loss, op, "grad_loss");
  CPF_CHECK(grad_loss.numel() == 1 && is_floating(grad_loss.dtype()), op,
            ": grad_loss must be a one-element floating tensor, got ", grad_loss.dtype(), " ", grad_loss.shape());
  const DType compute = compute_dtype(logits.dtype());
  const int64_t rows = logits.size(0);
  check_defined(lse, op, "lse");
  CPF_CHECK(lse.shape() == Shape{rows} && lse.dtype() == compute, op, ": lse must be ", compute, " [", rows,
            "] (from the forward), got ", lse.dtype(), " ", lse.shape());
  check_same_device(logits, lse, op);
}

// Checks every target and counts those that are not ignored.
template <class I>
int64_t count_valid(const I* targets, int64_t rows, int64_t classes, int64_t ignore_index, const char* op) {
  int64_t count = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = static_cast<int64_t>(targets[r]);
    if (t == ignore_index) continue;
    CPF_CHECK(t >= 0 && t < classes, op, ": target ", t, " at row ", r, " is out of range for C=", classes,
              " classes (expected 0..", classes - 1, " or ignore_index=", ignore_index, ")");
    ++count;
  }
  return count;
}

template <class Fn>
void visit_target_type(DType dtype, Fn&& fn) {
  if (dtype == DType::i32) {
    fn.template operator()<int32_t>();
  } else {
    fn.template operator()<int64_t>();
  }
}

}  // namespace

void check_targets_on_device(const Tensor& targets, int64_t classes, int64_t ignore_index, const char* op) {
  DeviceIndexCheck check;
  check.kind = DeviceIndexKind::target;
  check.op = op;
  check.index = targets;
  check.bound = classes;
  check.has_ignore = true;
  check.ignore_index = ignore_index;
  device_kernel(targets.device(), &DeviceOps::check_indices, op)(check);
}

CrossEntropyResult cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  const char* op = "cross_entropy";
  check_inputs(logits, targets, op);
  const DType compute = compute_dtype(logits.dtype());
  const Tensor tc = contiguous(targets);
  const int64_t rows = logits.size(0), classes = logits.size(1);
  CrossEntropyResult result;
  if (!logits.device().is_cpu()) {
    // Nothing comes back to the host: the targets are checked on the device (an error is raised at the
    // next synchronisation), and the mean loss and the count are formed there (f64, fixed order).
    const Device device = logits.device();
    check_targets_on_device(tc, classes, ignore_index, op);
    result.lse = empty({rows}, {.dtype = compute, .device = device});
    Tensor row_loss = empty({rows}, {.dtype = DType::f64, .device = device});
    device_kernel(device, &DeviceOps::cross_entropy, op)(result.lse, row_loss, contiguous(logits), tc, ignore_index);
    result.loss = empty({}, {.dtype = compute, .device = device});
    result.count = empty({}, {.dtype = DType::i64, .device = device});
    device_kernel(device, &DeviceOps::cross_entropy_loss, op)(result.loss, result.count, row_loss, tc, ignore_index);
    result.valid_count = -1;
    return result;
  }
  const Tensor lc = contiguous(to(logits, compute));
  result.lse = empty({rows}, {.dtype = compute});
  double total = 0;
  visit_target_type(tc.dtype(), [&]<class I>() {
    const I* tgt = tc.data<I>();
    result.valid_count = count_valid(tgt, rows, classes, ignore_index, op);
    visit_compute_dtype(compute, op, [&]<class T>() {
      const T* x = lc.data<T>();
      T* lse = result.lse.data<T>();
      // Per-row losses are summed afterwards in row order (in double): the same total for any thread count.
      std::vector<double> row_loss(static_cast<size_t>(rows), 0.0);
      const bool parallel = rows > 1 && rows * classes >= cpu::kParallelGrain;
#if defined(CPF_WITH_OPENMP)
#pragma omp parallel for if (parallel) schedule(static)
#endif
      for (int64_t r = 0; r < rows; ++r) {
        Eigen::Map<const Vec<T>> row(x + r * classes, classes);
        const T m = row.maxCoeff();
        const bool masked = m == -std::numeric_limits<T>::infinity() && !row.isNaN().any();
        const T l = masked ? m : m + std::log(cpu::exp_sum(x + r * classes, m, nullptr, classes));
        lse[r] = l;
        const int64_t t = static_cast<int64_t>(tgt[r]);
        if (t != ignore_index) row_loss[r] = static_cast<double>(l) - static_cast<double>(row[t]);
      }
      for (double v : row_loss) total += v;
    });
  });
  const double loss = result.valid_count > 0 ? total / static_cast<double>(result.valid_count) : 0.0;
  result.loss = scalar_tensor(loss, {.dtype = compute});
  result.count = scalar_tensor(static_cast<double>(result.valid_count), {.dtype = DType::i64});
  return result;
}

Tensor cross_entropy_backward(const Tensor& grad_loss, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              int64_t valid_count, int64_t ignore_index) {
  const char* op = "cross_entropy_backward";
  check_backward_inputs(grad_loss, logits, targets, lse, op);
  const DType compute = compute_dtype(logits.dtype());
  const int64_t rows = logits.size(0), classes = logits.size(1);
  const Tensor tc = contiguous(targets);
  if (!logits.device().is_cpu()) {
    visit_target_type(tc.dtype(), [&]<class I>() {
      const int64_t counted = count_valid(to(tc, Device::cpu()).data<I>(), rows, classes, ignore_index, op);
      CPF_CHECK(counted == valid_count, op, ": valid_count ", valid_count, " does not match the ", counted,
                " targets that are not ignore_index=", ignore_index);
    });
    const double scale = valid_count > 0 ? grad_loss.item<double>() / static_cast<double>(valid_count) : 0.0;
    Tensor out = empty({rows, classes}, {.dtype = logits.dtype(), .device = logits.device()});
    device_kernel(logits.device(), &DeviceOps::cross_entropy_backward, op)(out, contiguous(logits), tc, contiguous(lse),
                                                                           scale, ignore_index);
    return out;
  }
  const Tensor lc = contiguous(to(logits, compute));
  const Tensor lsec = contiguous(lse);
  Tensor out = empty({rows, classes}, {.dtype = compute});
  const double g = grad_loss.item<double>();
  visit_target_type(tc.dtype(), [&]<class I>() {
    const I* tgt = tc.data<I>();
    const int64_t counted = count_valid(tgt, rows, classes, ignore_index, op);
    CPF_CHECK(counted == valid_count, op, ": valid_count ", valid_count, " does not match the ", counted,
              " targets that are not ignore_index=", ignore_index);
    visit_compute_dtype(compute, op, [&]<class T>() {
      const T* x = lc.data<T>();
      const T* l = lsec.data<T>();
      T* o = out.data<T>();
      const T scale = valid_count > 0 ? static_cast<T>(g / static_cast<double>(valid_count)) : T(0);
      const bool parallel = rows > 1 && rows * classes >= cpu::kParallelGrain;
#if defined(CPF_WITH_OPENMP)
#pragma omp parallel for if (parallel) schedule(static)
#endif
      for (int64_t r = 0; r < rows; ++r) {
        Eigen::Map<Vec<T>> orow(o + r * classes, classes);
        const int64_t t = static_cast<int64_t>(tgt[r]);
        if (t == ignore_index) {
          orow.setZero();
          continue;
        }
        cpu::exp_sum(x + r * classes, l[r], o + r * classes, classes);  // softmax, from the saved lse
        orow *= scale;
        orow[t] -= scale;
      }
    });
  });
  return to(out, logits.dtype());
}

Tensor cross_entropy_backward(const Tensor& grad_loss, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              const Tensor& count, int64_t ignore_index) {
  const char* op = "cross_entropy_backward";
  check_defined(count, op, "count");
  CPF_CHECK(count.numel() == 1 && count.dtype() == DType::i64, op, ": count must be a one-element i64 tensor (",
            "CrossEntropyResult::count), got ", count.dtype(), " ", count.shape());
  if (logits.device().is_cpu() || count.device().is_cpu()) {
    return cross_entropy_backward(grad_loss, logits, targets, lse, count.item<int64_t>(), ignore_index);
  }
  check_backward_inputs(grad_loss, logits, targets, lse, op);
  const int64_t rows = logits.size(0), classes = logits.size(1);
  check_same_device(logits, count, op);
  // grad_loss / count is formed on the device (in f64, rounded to the compute type as the CPU does).
  const Tensor g = contiguous(to(to(grad_loss, logits.device()), DType::f64));
  Tensor out = empty({rows, classes}, {.dtype = logits.dtype(), .device = logits.device()});
  device_kernel(logits.device(), &DeviceOps::cross_entropy_backward_counted, op)(
      out, contiguous(logits), contiguous(targets), contiguous(lse), g, contiguous(count), ignore_index);
  return out;
}

}  // namespace cpf::raw
