#include "framework/tensor/ops/classifier_loss.h"

#include <algorithm>
#include <limits>

#include "framework/tensor/cpu/compute_types.h"
#include "framework/tensor/cpu/softmax_kernels.h"
#include "framework/tensor/cpu/strided_loop.h"
#include "framework/tensor/device_ops.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/cross_entropy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/linear.h"
#include "framework/tensor/ops/matmul.h"
#include "framework/tensor/ops/reduce.h"
#include "framework/tensor/ops/views.h"
#include "framework/tensor/profile.h"
#include "framework/tensor/shape_utils.h"

namespace cpf::raw {
namespace {

constexpr const char* kOp = "classifier_loss";

void check_inputs(const Tensor& hidden, const Tensor& weight, const Tensor& labels, const ClassifierLossOptions& o) {
  check_defined(hidden, kOp, "hidden");
  check_defined(weight, kOp, "weight");
  check_defined(labels, kOp, "labels");
  CPF_CHECK(is_floating(hidden.dtype()), kOp, ": hidden must be a floating tensor, got ", hidden.dtype());
  check_same_dtype(hidden, weight, kOp);
  check_same_device(hidden, weight, kOp);
  check_same_device(hidden, labels, kOp);
  CPF_CHECK(has_kernel(hidden.device(), &DeviceOps::classifier_rows), kOp, ": no kernel for device ", hidden.device(),
            " in this build");
  CPF_CHECK(hidden.dim() == 2, kOp, ": hidden must be 2-D (T, C), got shape ", hidden.shape(),
            " (flatten the leading dims first)");
  CPF_CHECK(weight.dim() == 2 && weight.size(1) == hidden.size(1) && weight.size(0) > 0, kOp,
            ": weight must be (V, C) with V >= 1 and C = hidden's ", hidden.size(1), ", got ", weight.shape());
  CPF_CHECK(labels.dtype() == DType::i32 || labels.dtype() == DType::i64, kOp, ": labels must be i32 or i64, got ",
            labels.dtype());
  CPF_CHECK(labels.shape() == Shape{hidden.size(0)}, kOp, ": labels must have shape [", hidden.size(0),
            "] to match hidden ", hidden.shape(), ", got ", labels.shape());
  CPF_CHECK(o.normalizer >= 0, kOp, ": normalizer=", o.normalizer,
            " must be >= 1 (the valid-label count that divides the summed loss) or 0 (this call's count)");
  CPF_CHECK(o.chunk_rows >= 0, kOp, ": chunk_rows=", o.chunk_rows, " must be >= 1, or 0 to choose it by memory");
  if (const Tensor& n = o.normalizer_tensor; n.defined()) {
    CPF_CHECK(n.dtype() == DType::f64 && n.dim() == 0 && n.device() == hidden.device(), kOp,
              ": normalizer_tensor must be a () f64 tensor on ", hidden.device(), ", got ", n.shape(), " ", n.dtype(),
              " on ", n.device());
    CPF_CHECK(o.normalizer >= 1, kOp, ": normalizer_tensor needs normalizer >= 1 (the same count), got ", o.normalizer);
  }
}

// Checks every label (CPU) and counts those that are not ignored; the message is the device check's.
int64_t count_valid(const Tensor& labels, int64_t vocab, int64_t ignore_index) {
  const std::vector<int64_t> l = to(labels, DType::i64).to_vector<int64_t>();
  int64_t count = 0;
  for (size_t r = 0; r < l.size(); ++r) {
    if (l[r] == ignore_index) continue;
    CPF_CHECK(l[r] >= 0 && l[r] < vocab, kOp, ": target ", l[r], " at row ", r, " is out of range for C=", vocab,
              " classes (expected 0..", vocab - 1, " or ignore_index=", ignore_index, ")");
    ++count;
  }
  return count;
}

// The CPU row pass over one chunk, in the compute type T: the unfused path's formulas
// (cross_entropy.cpp), so f64 results agree with it to rounding.
template <class T>
void cpu_rows(T* x, const int64_t* label, double* row_loss, int64_t rows, int64_t vocab, double scale_d,
              bool write_grad, int64_t ignore_index) {
  const T scale = static_cast<T>(scale_d);
  const bool parallel = rows > 1 && rows * vocab >= cpu::kParallelGrain;
#if defined(CPF_WITH_OPENMP)
#pragma omp parallel for if (parallel) schedule(static)
#endif
  for (int64_t r = 0; r < rows; ++r) {
    T* xr = x + r * vocab;
    Map<T> row(xr, vocab);
    const int64_t t = label[r];
    if (t == ignore_index) {
      row_loss[r] = 0.0;
      if (write_grad) row.setZero();
      continue;
    }
    const T m = row.maxCoeff();
    const bool masked = m == -std::numeric_limits<T>::infinity() && !row.isNaN().any();
    const T l = masked ? m : m + std::log(cpu::exp_sum(xr, m, nullptr, vocab));
    row_loss[r] = static_cast<double>(l) - static_cast<double>(row[t]);
    if (!write_grad) continue;
    cpu::exp_sum(xr, l, xr, vocab);  // softmax in place, from the lse
    row *= scale;
    row[t] -= scale;
  }
}

// One chunk's row pass: row losses into row_loss (R) f64; dlogits over `logits` when write_grad.
void row_pass(const Tensor& logits, const Tensor& labels, const Tensor& row_loss, double scale, const Tensor& divisor,
              bool write_grad, int64_t ignore_index) {
  if (!logits.device().is_cpu()) {
    device_kernel(logits.device(), &DeviceOps::classifier_rows, kOp)(logits, row_loss, labels, scale, divisor,
                                                                     write_grad, ignore_index);
    profile::add_work(0, (write_grad ? 2 : 1) * profile::tensor_bytes(logits));
    return;
  }
  if (divisor.defined()) scale = 1.0 / divisor.item<double>();
  const Tensor work = to(logits, compute_dtype(logits.dtype()));  // logits itself unless bf16
  const Tensor lab = to(labels, DType::i64);
  visit_compute_dtype(work.dtype(), kOp, [&]<class T>() {
    cpu_rows<T>(work.data<T>(), lab.data<int64_t>(), row_loss.data<double>(), logits.size(0), logits.size(1), scale,
                write_grad, ignore_index);
  });
  if (write_grad && work.dtype() != logits.dtype()) copy_(logits, work);
}

int64_t divisor_of(const Tensor& labels, int64_t vocab, const ClassifierLossOptions& o) {
  if (labels.device().is_cpu()) {
    const int64_t count = count_valid(labels, vocab, o.ignore_index);  // checks every label
    return o.normalizer > 0 ? o.normalizer : std::max<int64_t>(count, 1);
  }
  check_targets_on_device(labels, vocab, o.ignore_index, kOp);  // no wait: reported at the next synchronisation
  if (o.normalizer > 0) return o.normalizer;
  return std::max<int64_t>(count_valid(to(labels, Device::cpu()), vocab, o.ignore_index), 1);
}

}  // namespace

int64_t classifier_chunk_rows(int64_t requested, int64_t rows, int64_t vocab, DType dtype) {
  CPF_CHECK(requested >= 0 && rows >= 0 && vocab >= 1, "classifier_chunk_rows: requested=", requested, " rows=", rows,
            " vocab=", vocab, " (need requested >= 0, rows >= 0, vocab >= 1)");
  int64_t chunk = requested;
  if (chunk == 0 && rows > 0) {
    const int64_t row_bytes = vocab * static_cast<int64_t>(dtype_size(dtype));
    const int64_t budget = std::max<int64_t>(kClassifierChunkBytes / row_bytes / 128 * 128, 128);
    // As many chunks as the budget needs, of equal size (a multiple of 128, at most the budget): 32768
    // rows in 10624-row chunks would leave a last chunk of 896 rows whose GEMMs run far below the rate.
    const int64_t chunks = (rows + budget - 1) / budget;
    chunk = ((rows + chunks - 1) / chunks + 127) / 128 * 128;
  }
  return std::max<int64_t>(std::min(chunk, rows), 1);
}

ClassifierLossResult classifier_loss(const Tensor& hidden, const Tensor& weight, const Tensor& labels,
                                     const ClassifierLossOptions& o) {
  check_inputs(hidden, weight, labels, o);
  const int64_t rows = hidden.size(0), vocab = weight.size(0), width = hidden.size(1);
  const DType compute = compute_dtype(hidden.dtype());
  const Device device = hidden.device();
  ClassifierLossResult result;
  result.divisor = divisor_of(labels, vocab, o);
  result.chunk_rows = classifier_chunk_rows(o.chunk_rows, rows, vocab, hidden.dtype());
  const double scale = 1.0 / static_cast<double>(result.divisor);
  const Tensor lab = contiguous(labels);
  const Tensor row_loss = zeros({rows}, {.dtype = DType::f64, .device = device});  // (T) f64
  const Tensor weight_t = transpose(weight, 0, 1);                                 // (C, V) view
  if (o.compute_grads) result.dhidden = empty({rows, width}, {.dtype = compute, .device = device});
  Tensor dweight;  // (V, C) in the compute dtype, summed over the chunks
  for (int64_t begin = 0; begin < rows; begin += result.chunk_rows) {
    const int64_t n = std::min(result.chunk_rows, rows - begin);
    const Tensor h = narrow(hidden, 0, begin, n);  // (R, C)
    const Tensor logits = matmul(h, weight_t);     // (R, V): becomes dlogits in place
    row_pass(logits, narrow(lab, 0, begin, n), narrow(row_loss, 0, begin, n), scale, o.normalizer_tensor,
             o.compute_grads, o.ignore_index);
    if (!o.compute_grads) continue;
    copy_(narrow(result.dhidden, 0, begin, n), matmul(logits, weight));  // (R, C), widened for bf16
    // (V, C) += dlogits^T @ h_chunk: on a device one GEMM accumulating into the f32 sum (beta = 1).
    dweight = linear_param_grads(logits, h, compute, false, dweight).weight;
  }
  if (o.compute_grads) {
    result.dweight = dweight.defined() ? dweight : zeros({vocab, width}, {.dtype = compute, .device = device});
  }
  // Row losses summed in f64 (in row order on the CPU), divided once.
  Tensor total;
  if (device.is_cpu()) {
    double s = 0.0;
    for (double v : row_loss.to_vector<double>()) s += v;
    total = scalar_tensor(s, {.dtype = DType::f64});
  } else {
    total = sum(row_loss);
  }
  const Tensor divided = o.normalizer_tensor.defined()
                             ? binary(BinaryOp::div, total, o.normalizer_tensor)
                             : binary(BinaryOp::div, total, static_cast<double>(result.divisor));
  result.loss = to(divided, compute);
  return result;
}

}  // namespace cpf::raw
