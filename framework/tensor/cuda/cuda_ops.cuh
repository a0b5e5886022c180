#pragma once
// Internal entry points of the CUDA backend shared between its .cpp files (private).
#include <vector>

#include "framework/tensor/device_ops.h"

namespace cpf::cuda {

// The cuda kernel table, installed by register_backend().
const DeviceOps& cuda_device_ops();

// The DeviceOps::matmul entry (matmul.cpp, cuBLASLt).
void matmul(const Tensor& out, const Tensor& a, const Tensor& b);
// The DeviceOps::matmul_bias entry: the bias in the GEMM's epilogue.
void matmul_bias(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias);
// The few-row GEMV kernel where cuda::gemv_applies (cuda.h; matmul_gemv.cpp); aux defined: the GELU epilogue
// with the pre-activation there.
void gemv(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& aux);
// The DeviceOps::matmul_epilogue entry (matmul_epilogue.cpp).
bool matmul_epilogue(const Tensor& out, const Tensor& a, const Tensor& b, const DeviceGemmArgs& args);
// The norm and loss entries (nn_ops.cpp).
void norm(bool centered, const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x, const Tensor& weight,
          const Tensor& bias, double eps);
void norm_backward(bool centered, const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& grad_y,
                   const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd);
void add_norm(bool centered, const Tensor& x1, const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
              const Tensor& branch, const Tensor& weight, const Tensor& bias, double eps);
void add_norm_backward(bool centered, const Tensor& dx, const Tensor& dbranch, const Tensor& dweight,
                       const Tensor& dbias, const Tensor& grad_x1, const Tensor& grad_y, const Tensor& x1,
                       const Tensor& weight, const Tensor& mean, const Tensor& rstd);
void cross_entropy(const Tensor& lse, const Tensor& row_loss, const Tensor& logits, const Tensor& targets,
                   int64_t ignore_index);
void cross_entropy_backward(const Tensor& out, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            double scale, int64_t ignore_index);
void cross_entropy_loss(const Tensor& loss, const Tensor& count, const Tensor& row_loss, const Tensor& targets,
                        int64_t ignore_index);
void cross_entropy_backward_counted(const Tensor& out, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                    const Tensor& grad_loss, const Tensor& count, int64_t ignore_index);
void classifier_rows(const Tensor& logits, const Tensor& row_loss, const Tensor& labels, double scale,
                     const Tensor& divisor, bool write_grad, int64_t ignore_index);
// The multi-tensor optimizer entries (optim_ops.cpp): DeviceOps::sum_squares, adamw_step, clip_by_norm_.
void sum_squares(const Tensor& out, const std::vector<Tensor>& tensors);
void adamw_step(const std::vector<DeviceAdamWParam>& params, const DeviceAdamW& h);
void clip_by_norm_(const std::vector<Tensor>& tensors, const Tensor& sum_squares, double max_norm);
// The FP8 entries (fp8_ops.cpp): DeviceOps::fp8_amax, fp8_scale, quantize_fp8, the activation and row
// casts, dequantize_fp8, fp8_matmul_nt, fp8_update_scales.
void fp8_amax(const Tensor& out, const Tensor& x);
void fp8_scale(const Tensor& out, const Tensor& amax, double fp8_max, int64_t margin, const Tensor& fallback);
void quantize_fp8(const Tensor& q, const Tensor& qt, const Tensor& x, const Tensor& scale, const Tensor& amax_out,
                  const Tensor& column_sums);
bool fp8_activation_amax(const Tensor& out, const Tensor& pre, int activation);
bool quantize_fp8_activation(const Tensor& q, const Tensor& qt, const Tensor& pre, int activation, const Tensor& scale,
                             const Tensor& amax_out);
std::vector<bool> fp8_amax_rows(const std::vector<Tensor>& out, const std::vector<std::vector<Tensor>>& weights);
std::vector<bool> quantize_fp8_rows(const std::vector<Tensor>& q, const std::vector<Tensor>& qt,
                                    const std::vector<std::vector<Tensor>>& weights, const std::vector<Tensor>& scale,
                                    const std::vector<Tensor>& amax_out);
void dequantize_fp8(const Tensor& out, const Tensor& q, const Tensor& scale_inv);
void fp8_matmul_nt(const Tensor& out, const Tensor& a, const Tensor& a_scale_inv, const Tensor& b,
                   const Tensor& b_scale_inv, const Tensor& bias, bool fast_accumulation);
void fp8_update_scales(const Tensor& history, const Tensor& amax, const Tensor& scale, const Tensor& fp8_max,
                       int64_t margin, bool most_recent, const Tensor& skip, const Tensor& clipped);

}  // namespace cpf::cuda
