// The norm and loss entries of the cuda kernel table (framework/tensor/device_ops.h): LayerNorm/RMSNorm and
// the fused add + norm, forward and backward (norm.cu, add_norm.cu), and the cross-entropy and fused
// classifier row passes (cross_entropy.cu, classifier_loss.cu).
#include "framework/tensor/cuda/cuda_ops.cuh"
#include "framework/tensor/cuda/kernels.cuh"
#include "framework/tensor/cuda/launch.cuh"

namespace cpf::cuda {
namespace {

namespace k = kernels;

const void* ptr_or_null(const Tensor& t) { return t.defined() ? t.raw_data() : nullptr; }
void* mut_ptr_or_null(const Tensor& t) { return t.defined() ? t.raw_data() : nullptr; }

}  // namespace

void norm(bool centered, const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x, const Tensor& weight,
          const Tensor& bias, double eps) {
  Launch launch(x.device());
  const int64_t cols = x.size(-1), rows = x.numel() / cols;
  k::launch_norm(centered, code(x.dtype()), x.raw_data(), ptr_or_null(weight), ptr_or_null(bias), y.raw_data(),
                 mut_ptr_or_null(mean), rstd.raw_data(), rows, cols, eps, launch.stream);
}

void norm_backward(bool centered, const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& grad_y,
                   const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd) {
  Launch launch(x.device());
  const int64_t cols = x.size(-1), rows = x.numel() / cols;
  const bool params = dweight.defined() || dbias.defined();
  const size_t ws_bytes = params ? k::norm_backward_workspace_bytes(code(x.dtype()), rows, cols) : 0;
  Tensor ws =
      ws_bytes ? empty({static_cast<int64_t>(ws_bytes)}, {.dtype = DType::boolean, .device = x.device()}) : Tensor();
  k::launch_norm_backward(centered, code(x.dtype()), grad_y.raw_data(), x.raw_data(), ptr_or_null(weight),
                          ptr_or_null(mean), rstd.raw_data(), dx.raw_data(), mut_ptr_or_null(dweight),
                          mut_ptr_or_null(dbias), rows, cols, ws_bytes ? ws.raw_data() : nullptr, launch.stream);
}

void add_norm(bool centered, const Tensor& x1, const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
              const Tensor& branch, const Tensor& weight, const Tensor& bias, double eps) {
  Launch launch(x.device());
  const int64_t cols = x.size(-1), rows = x.numel() / cols;
  k::launch_add_norm(centered, code(x.dtype()), branch.defined() ? code(branch.dtype()) : code(x.dtype()),
                     code(y.dtype()), x.raw_data(), ptr_or_null(branch), ptr_or_null(weight), ptr_or_null(bias),
                     mut_ptr_or_null(x1), y.raw_data(), mut_ptr_or_null(mean), rstd.raw_data(), rows, cols, eps,
                     launch.stream);
}

void add_norm_backward(bool centered, const Tensor& dx, const Tensor& dbranch, const Tensor& dweight,
                       const Tensor& dbias, const Tensor& grad_x1, const Tensor& grad_y, const Tensor& x1,
                       const Tensor& weight, const Tensor& mean, const Tensor& rstd) {
  Launch launch(x1.device());
  const int64_t cols = x1.size(-1), rows = x1.numel() / cols;
  const bool params = dweight.defined() || dbias.defined();
  const size_t ws_bytes = params ? k::norm_backward_workspace_bytes(code(x1.dtype()), rows, cols) : 0;
  Tensor ws =
      ws_bytes ? empty({static_cast<int64_t>(ws_bytes)}, {.dtype = DType::boolean, .device = x1.device()}) : Tensor();
  k::launch_add_norm_backward(centered, code(x1.dtype()), code(grad_y.dtype()),
                              dbranch.defined() ? code(dbranch.dtype()) : code(x1.dtype()), grad_y.raw_data(),
                              x1.raw_data(), ptr_or_null(weight), ptr_or_null(mean), rstd.raw_data(),
                              ptr_or_null(grad_x1), dx.raw_data(), mut_ptr_or_null(dbranch), mut_ptr_or_null(dweight),
                              mut_ptr_or_null(dbias), rows, cols, ws_bytes ? ws.raw_data() : nullptr, launch.stream);
}

void cross_entropy(const Tensor& lse, const Tensor& row_loss, const Tensor& logits, const Tensor& targets,
                   int64_t ignore_index) {
  Launch launch(logits.device());
  k::launch_cross_entropy(code(logits.dtype()), code(targets.dtype()), logits.raw_data(), targets.raw_data(),
                          lse.raw_data(), static_cast<double*>(row_loss.raw_data()), logits.size(0), logits.size(1),
                          ignore_index, launch.stream);
}

void cross_entropy_backward(const Tensor& out, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            double scale, int64_t ignore_index) {
  Launch launch(logits.device());
  k::launch_cross_entropy_backward(code(logits.dtype()), code(targets.dtype()), logits.raw_data(), targets.raw_data(),
                                   lse.raw_data(), out.raw_data(), logits.size(0), logits.size(1), scale, nullptr,
                                   nullptr, ignore_index, launch.stream);
}

void cross_entropy_loss(const Tensor& loss, const Tensor& count, const Tensor& row_loss, const Tensor& targets,
                        int64_t ignore_index) {
  Launch launch(row_loss.device());
  k::launch_cross_entropy_loss(code(loss.dtype()), code(targets.dtype()),
                               static_cast<const double*>(row_loss.raw_data()), targets.raw_data(), row_loss.numel(),
                               ignore_index, loss.raw_data(), static_cast<int64_t*>(count.raw_data()), launch.stream);
}

void cross_entropy_backward_counted(const Tensor& out, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                    const Tensor& grad_loss, const Tensor& count, int64_t ignore_index) {
  Launch launch(logits.device());
  k::launch_cross_entropy_backward(code(logits.dtype()), code(targets.dtype()), logits.raw_data(), targets.raw_data(),
                                   lse.raw_data(), out.raw_data(), logits.size(0), logits.size(1), 0.0,
                                   static_cast<const double*>(grad_loss.raw_data()),
                                   static_cast<const int64_t*>(count.raw_data()), ignore_index, launch.stream);
}

void classifier_rows(const Tensor& logits, const Tensor& row_loss, const Tensor& labels, double scale,
                     const Tensor& divisor, bool write_grad, int64_t ignore_index) {
  Launch launch(logits.device());
  k::launch_classifier_rows(code(logits.dtype()), code(labels.dtype()), logits.raw_data(), labels.raw_data(),
                            static_cast<double*>(row_loss.raw_data()), logits.size(0), logits.size(1), scale,
                            divisor.defined() ? static_cast<const double*>(divisor.raw_data()) : nullptr, write_grad,
                            ignore_index, launch.stream);
}

}  // namespace cpf::cuda
