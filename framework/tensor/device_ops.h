#pragma once
// Device dispatch for the raw ops: a table of kernel entry points per device type, filled in by the
// library that implements the device (framework/tensor/cuda fills the cuda table when it registers).
//
// A raw op validates its inputs exactly as on the CPU, allocates its output on the inputs' device,
// then calls the entry for that device. An absent table or entry is reported as
//   "<op>: no kernel for device cuda:0 in this build"
// so a CPU-only build, or a device library that lacks a kernel, fails with one message everywhere.
//
// Contract of every entry: inputs are on one device (checked by the caller) and already validated;
// outputs are allocated by the caller with the documented shape and dtype; kernels run on the calling
// thread's current stream of that device and do not synchronise with the host unless stated.
#include <cstdint>
#include <vector>

#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/rope_frequencies.h"
#include "framework/tensor/tensor.h"

namespace cpf {

enum class DeviceReduceOp { sum, mean, amax, logsumexp, argmax };
enum class DeviceSoftmaxOp { softmax, log_softmax, softmax_backward, log_softmax_backward };

enum class DeviceRandomOp { uniform, normal, randint };

// A Philox draw: element i uses block (seed, first + i). uniform: [a, b) with results that would round
// to b in `dtype` (f32/bf16) moved one step below, as on the CPU; normal: mean a, stddev b; randint:
// low + (64 random bits) % span (span as the CPU computes it).
struct DeviceRandom {
  DeviceRandomOp op = DeviceRandomOp::uniform;
  uint64_t seed = 0, first = 0;
  double a = 0.0, b = 0.0;
  int64_t low = 0;
  uint64_t span = 1;
  DType dtype = DType::f32;
};

// What DeviceOps::matmul_epilogue does after the product p = a @ b (cuBLASLt's epilogues; GELU is the
// tanh approximation, as raw::UnaryOp::gelu).
enum class DeviceGemmEpilogue {
  none,   // out = p, or out += p with accumulate
  gelu,   // aux = p [+ bias], out = gelu(aux)
  dgelu,  // out = p * gelu'(aux)
};
struct DeviceGemmArgs {
  DeviceGemmEpilogue epilogue = DeviceGemmEpilogue::none;
  Tensor bias;              // gelu: (N) of out's dtype, contiguous, 16-byte aligned; or undefined
  Tensor aux;               // gelu: written, dgelu: read; (M, N) contiguous of out's dtype
  Tensor bias_grad;         // written, of out's dtype, or undefined: dgelu: (N) column sums of out;
                            // none: (M) row sums of a (the bias gradient beside a weight-gradient GEMM)
  bool accumulate = false;  // none only: out += p (out already holds a value)
};

// One parameter of a fused AdamW step.
struct DeviceAdamWParam {
  Tensor param, grad, exp_avg, exp_avg_sq;
  double weight_decay = 0.0;
};
// lr, betas, eps and the 1-based step t (bias corrections 1 - beta^t computed as AdamW::update does).
struct DeviceAdamW {
  double lr = 0.0, beta1 = 0.0, beta2 = 0.0, eps = 0.0;
  int64_t step = 1;
  // (1) f64 on the parameters' device (a gradient sum of squares), or undefined: when the square root of
  // its value is not finite the step changes nothing, decided on the device (no read-back).
  Tensor skip_if_nonfinite;
  // Deferred steps (Optimizer::step_deferred): a (1) i64 count c of applied steps on the parameters' device,
  // or undefined. When defined the step taken is c + 1, one of step .. step + candidates - 1 (the host
  // computes each candidate's scalars), c is first set to step - 1 when reset_applied_steps, and c grows by
  // 1 after the update when the step is applied (the skip rule above).
  Tensor applied_steps;
  int64_t candidates = 1;
  bool reset_applied_steps = false;
};

// A range check of index values done on the device (see DeviceOps::check_indices). Which CPU message
// a failure reproduces: index (index.cpp), embedding id (embedding.cpp), cross-entropy target.
enum class DeviceIndexKind { index, embedding_id, target };
struct DeviceIndexCheck {
  DeviceIndexKind kind = DeviceIndexKind::index;
  const char* op = "";      // a string literal: the message is built after the call returns
  Tensor index;             // contiguous i32/i64; its shape gives the position in the message
  int64_t bound = 0;        // valid values: 0 <= v < bound
  int64_t dim = 0;          // index kind: the dim indexed
  bool has_ignore = false;  // target kind: ignore_index is allowed too
  int64_t ignore_index = 0;
};

struct DeviceOps {
  // dst (any strides, no self-overlap) = src broadcast to dst's shape, converted to dst's dtype.
  void (*copy)(const Tensor& dst, const Tensor& src) = nullptr;
  // dst[i] (bf16) = src[i] (f32) for every i, in one launch where the list allows: pairs of one shape, on
  // this device, contiguous, numel > 0 (raw::to_many, framework/tensor/ops/cast_many.h).
  void (*cast_many)(const std::vector<Tensor>& dst, const std::vector<Tensor>& src) = nullptr;
  // Every element of dst (any strides) = value converted to dst's dtype (bf16 rounds from f32).
  void (*fill)(const Tensor& dst, double value) = nullptr;

  // out (contiguous, x's shape and dtype) = op(x); bf16 computes in f32.
  void (*unary)(raw::UnaryOp op, const Tensor& out, const Tensor& x) = nullptr;
  // out (contiguous, x's shape and dtype) = grad * op'(x) (y = op(x)); grad, x, y share shape and dtype.
  void (*unary_backward)(raw::UnaryOp op, const Tensor& out, const Tensor& grad, const Tensor& x,
                         const Tensor& y) = nullptr;
  // out (contiguous, broadcast shape, a's dtype) = a op b. Integer division by zero throws the CPU's
  // message (this entry synchronises with the host for integer div only).
  void (*binary)(raw::BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b) = nullptr;
  // out (contiguous, broadcast shape, bool) = a op b; a and b share a dtype.
  void (*compare)(raw::CompareOp op, const Tensor& out, const Tensor& a, const Tensor& b) = nullptr;
  // out (contiguous, broadcast shape, a's dtype) = cond ? a : b.
  void (*where)(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) = nullptr;
  // dst += alpha * src (src broadcast to dst; alpha whole for integer dst), in place.
  void (*add_)(const Tensor& dst, const Tensor& src, double alpha) = nullptr;
  // dst *= value in place, computed as the CPU does (double product, f32 for bf16).
  void (*mul_)(const Tensor& dst, double value) = nullptr;

  // rows (K, R) contiguous floating -> out (K) contiguous: rows' dtype, i64 for argmax. R may be 0
  // (sum 0, mean NaN, logsumexp -inf); the caller rejects amax/argmax over an empty dim.
  void (*reduce_rows)(DeviceReduceOp op, const Tensor& out, const Tensor& rows) = nullptr;
  // cols (R, K) contiguous floating -> out (K) contiguous of cols' dtype, folded over R in place (no
  // transposing copy): op is sum, mean or amax. R may be 0 (sum 0, mean NaN).
  void (*reduce_cols)(DeviceReduceOp op, const Tensor& out, const Tensor& cols) = nullptr;

  // a (and b for the backward ops) contiguous, one shape and floating dtype; out contiguous, same
  // shape and dtype. Forward: a = x. Backward: a = grad_y, b = y.
  void (*softmax)(DeviceSoftmaxOp op, const Tensor& out, const Tensor& a, const Tensor& b, int64_t dim) = nullptr;

  // a (..., M, K) @ b (..., K, N) -> out (batch..., M, N) contiguous, with batch the broadcast of the
  // leading dims; K > 0. a and b have one floating dtype and either of their last two strides equal
  // to 1 (transposed views are read in place).
  void (*matmul)(const Tensor& out, const Tensor& a, const Tensor& b) = nullptr;
  // out (M, N) = a (M, K) @ b (K, N) + bias (N), the bias added in the GEMM's epilogue: 2-D operands as
  // for matmul, f32 or bf16, M, N, K > 0, bias contiguous and 16-byte aligned, of out's dtype.
  void (*matmul_bias)(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias) = nullptr;
  // out (M, N) = the epilogue of a (M, K) @ b (K, N) in one GEMM (DeviceGemmArgs). 2-D operands as for
  // matmul, f32 or bf16, M, N, K > 0; out of a's dtype, or f32 for bf16 operands (epilogue none).
  // gelu/dgelu need N % 8 == 0 (cuBLASLt's rule for aux). Returns false, having written nothing, when
  // cuBLASLt has no algorithm for the combination: the caller then runs the unfused ops.
  bool (*matmul_epilogue)(const Tensor& out, const Tensor& a, const Tensor& b, const DeviceGemmArgs& args) = nullptr;

  // LayerNorm (centered) / RMSNorm over the last dim. x (rows, C) contiguous floating; weight, bias (C)
  // contiguous of x's dtype or undefined. y (rows, C) x's dtype; mean (rows, centered only), rstd (rows)
  // in the compute dtype (f32 for bf16).
  void (*norm)(bool centered, const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
               const Tensor& weight, const Tensor& bias, double eps) = nullptr;
  // dx (rows, C) x's dtype; dweight (C) x's dtype or undefined; dbias (C) x's dtype or undefined.
  // Parameter gradients are summed over rows in a fixed order (deterministic).
  void (*norm_backward)(bool centered, const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                        const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd) = nullptr;
  // Residual add fused with the norm (framework/tensor/ops/add_norm.h): x1 = x + branch, y = norm(x1) in y's
  // dtype. x, weight, bias (or undefined), x1 of one dtype; branch of x's dtype or bf16, or undefined (no add:
  // x1 undefined); y of x's dtype or bf16; mean (centered only), rstd in the compute dtype. All contiguous.
  void (*add_norm)(bool centered, const Tensor& x1, const Tensor& y, const Tensor& mean, const Tensor& rstd,
                   const Tensor& x, const Tensor& branch, const Tensor& weight, const Tensor& bias,
                   double eps) = nullptr;
  // dx (x1's dtype) = grad_x1 (undefined: 0) + the norm's input gradient of grad_y (y's dtype); dbranch (its
  // dtype, or undefined) = dx converted; dweight, dbias (x1's dtype, or undefined) summed as for norm_backward.
  void (*add_norm_backward)(bool centered, const Tensor& dx, const Tensor& dbranch, const Tensor& dweight,
                            const Tensor& dbias, const Tensor& grad_x1, const Tensor& grad_y, const Tensor& x1,
                            const Tensor& weight, const Tensor& mean, const Tensor& rstd) = nullptr;

  // out[p] = x[p with p[dim] = index[q]] where `index_select`: q = p[dim] (index 1-D), else q = p
  // (gather: index has out's shape). Indices are in range (checked by the caller); any strides.
  void (*gather)(const Tensor& out, const Tensor& x, int64_t dim, const Tensor& index, bool index_select) = nullptr;
  // In place, deterministic (every destination element gets its terms in index-position order):
  // index_add: acc.select(dim, index[i]) += src.select(dim, i); else scatter_add: acc[p with p[dim] =
  // index[p]] += src[p]. acc is f32/f64/i32/i64 with src of its dtype, or f32 with a bf16 src.
  void (*scatter_add)(const Tensor& acc, int64_t dim, const Tensor& index, const Tensor& src, bool index_add) = nullptr;
  // In index-position order: dst.select(dim, index[i]) = src.select(dim, i) (a repeated index keeps the
  // last row); src of dst's dtype; indices in range (checked by the caller); any strides.
  void (*index_copy)(const Tensor& dst, int64_t dim, const Tensor& index, const Tensor& src) = nullptr;
  // out (V, C) of grad's compute dtype (f32 for bf16): row v = the sum, in position order from 0, of the
  // rows i of grad (N, C) contiguous with ids[i] == v; ids (N) i32/i64 contiguous, in range (checked by
  // the caller; an out-of-range id is skipped). Bitwise the CPU's sum, no host round trip.
  void (*embedding_backward)(const Tensor& out, const Tensor& grad, const Tensor& ids) = nullptr;

  // logits (N, C) contiguous floating, targets (N) i32/i64 in range or ignore_index. lse (N) compute
  // dtype; row_loss (N) f64 = lse - logits[target] (0 on ignored rows).
  void (*cross_entropy)(const Tensor& lse, const Tensor& row_loss, const Tensor& logits, const Tensor& targets,
                        int64_t ignore_index) = nullptr;
  // out (N, C) logits' dtype = (exp(logits - lse) - onehot(target)) * scale; ignored rows 0.
  void (*cross_entropy_backward)(const Tensor& out, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                 double scale, int64_t ignore_index) = nullptr;
  // On the device, without a host synchronisation: loss (scalar, lse's dtype) = the mean of row_loss (N, f64)
  // over the rows whose target is not ignore_index (0 when there are none; summed in a fixed order in f64);
  // count (scalar i64) = their number.
  void (*cross_entropy_loss)(const Tensor& loss, const Tensor& count, const Tensor& row_loss, const Tensor& targets,
                             int64_t ignore_index) = nullptr;
  // cross_entropy_backward with scale = grad_loss / count read on the device: grad_loss (1) f64, count (1)
  // i64 (from cross_entropy_loss).
  void (*cross_entropy_backward_counted)(const Tensor& out, const Tensor& logits, const Tensor& targets,
                                         const Tensor& lse, const Tensor& grad_loss, const Tensor& count,
                                         int64_t ignore_index) = nullptr;
  // The fused classifier's row pass (ops/classifier_loss.h), in place over logits (R, V) contiguous floating:
  // row_loss (R) f64 = lse - logits[label] (0 on ignored rows); with write_grad, logits = (softmax -
  // onehot(label)) * scale in their dtype (ignored rows 0). labels (R) contiguous i32/i64, in range or ignore_index.
  // divisor: undefined, or a () f64 on the device whose value d makes scale 1 / d, read there (CUDA graphs).
  void (*classifier_rows)(const Tensor& logits, const Tensor& row_loss, const Tensor& labels, double scale,
                          const Tensor& divisor, bool write_grad, int64_t ignore_index) = nullptr;

  // Checks index values on the device without waiting for it. A failure is recorded on the device and
  // thrown, with the CPU's message, by the next call that synchronises with the device (see
  // framework/tensor/cuda/cuda.h). Kernels using the indices skip out-of-range values meanwhile.
  void (*check_indices)(const DeviceIndexCheck& check) = nullptr;

  // RoPE (framework/tensor/ops/rope.h): x (B, T, H, D) with unit stride along D (B = 1 for thd),
  // positions (T) or (B, T) contiguous i32/i64; out contiguous, x's shape and dtype.
  void (*rope)(const Tensor& out, const Tensor& x, const Tensor& positions, const RopeFrequencies& frequencies,
               int64_t rotary_dim, bool inverse) = nullptr;

  // SwiGLU's gate (framework/tensor/ops/swiglu.h), all (rows, I) with unit column stride and any row
  // stride (out contiguous), the inputs' dtype. out = silu(gate) * up; the backward
  // writes d_gate and d_up in one pass from grad (dy).
  void (*swiglu)(const Tensor& out, const Tensor& gate, const Tensor& up) = nullptr;
  void (*swiglu_backward)(const Tensor& d_gate, const Tensor& d_up, const Tensor& dy, const Tensor& gate,
                          const Tensor& up) = nullptr;

  // Philox draws (framework/tensor/random.cpp): out (n) contiguous f64 gets, for element i, exactly
  // the value the CPU computes from philox_block(seed, first + i) before its dtype conversion.
  void (*philox)(const DeviceRandom& params, const Tensor& out) = nullptr;

  // out (1) f64 = the sum over `tensors` (contiguous, floating, on out's device) of the squares of
  // their elements, accumulated in f64. One launch for all tensors plus a fixed-order combine.
  void (*sum_squares)(const Tensor& out, const std::vector<Tensor>& tensors) = nullptr;

  // One AdamW step (framework/optim/adamw.h) over every entry of `params` in one launch per parameter
  // dtype, each element rounded exactly as the raw-op sequence of AdamW::update (and, for bf16
  // parameters, the f32 update rounded back once). Tensors contiguous on one device; state f32 (f64 for
  // f64 parameters); grad of the parameter's dtype.
  void (*adamw_step)(const std::vector<DeviceAdamWParam>& params, const DeviceAdamW& hyper) = nullptr;

  // Gradient clipping decided on the device (framework/optim/grad_clip.h): norm = sqrt(sum_squares[0]),
  // sum_squares (1) f64 as sum_squares writes it; when the norm is finite and > max_norm every element of
  // `tensors` (contiguous, floating, on sum_squares' device) is multiplied in place by
  // max_norm / (norm + 1e-6), rounded as mul_; otherwise nothing changes. One launch for all tensors.
  void (*clip_by_norm_)(const std::vector<Tensor>& tensors, const Tensor& sum_squares, double max_norm) = nullptr;

  // FP8 (framework/tensor/ops/fp8.h): operands contiguous on one device, validated by the caller; scales
  // and amaxes () f32, read and written on the device.
  // out = max |x| (NaN when x holds one); x f32, bf16 or f64 with numel > 0.
  void (*fp8_amax)(const Tensor& out, const Tensor& x) = nullptr;
  // out = fp8_max / amax / 2^margin, or fallback's value (undefined: 1) when amax is 0 or not finite.
  void (*fp8_scale)(const Tensor& out, const Tensor& amax, double fp8_max, int64_t margin,
                    const Tensor& fallback) = nullptr;
  // q (f8e4m3/f8e5m2, x's numel) = fp8(x * scale) saturating, or undefined; qt (or undefined): for a 2-D x
  // (R, C), the same codes transposed (C, R), from the same pass; amax_out (or undefined) = max(amax_out,
  // max |x|); column_sums (or undefined; qt defined): (C) f32 = x summed over its rows. At least one of q
  // and qt is defined.
  void (*quantize_fp8)(const Tensor& q, const Tensor& qt, const Tensor& x, const Tensor& scale, const Tensor& amax_out,
                       const Tensor& column_sums) = nullptr;
  // The same for h = activation(pre) without writing h (framework/tensor/ops/fp8_activation.h): pre bf16
  // contiguous, (R, C) for gelu or (R, 2 C) = [gate | up] for swiglu; h rounded to bf16 before the cast.
  // out = max |h|; q, qt, amax_out as quantize_fp8's (qt defined). false (nothing done): the backend cannot
  // fuse this shape, and the caller computes h and casts it.
  bool (*fp8_activation_amax)(const Tensor& out, const Tensor& pre, int activation) = nullptr;
  bool (*quantize_fp8_activation)(const Tensor& q, const Tensor& qt, const Tensor& pre, int activation,
                                  const Tensor& scale, const Tensor& amax_out) = nullptr;
  // Many weights at once (framework/tensor/ops/fp8_rows.h): weights[i] the row blocks of weight i (contiguous,
  // 2-D, one width, f32 or bf16); out[i] () f32 zero on entry. Returns, per weight, whether it was done: the
  // backend takes the weights whose every block fits its kernel and the caller casts the others one by one.
  std::vector<bool> (*fp8_amax_rows)(const std::vector<Tensor>& out,
                                     const std::vector<std::vector<Tensor>>& weights) = nullptr;
  // q[i] (N_i, K), qt[i] (K, N_i) fp8 = weight i cast with scale[i]; amax_out[i] (or undefined) folded.
  std::vector<bool> (*quantize_fp8_rows)(const std::vector<Tensor>& q, const std::vector<Tensor>& qt,
                                         const std::vector<std::vector<Tensor>>& weights,
                                         const std::vector<Tensor>& scale,
                                         const std::vector<Tensor>& amax_out) = nullptr;
  // out (f32 or bf16) = q * scale_inv.
  void (*dequantize_fp8)(const Tensor& out, const Tensor& q, const Tensor& scale_inv) = nullptr;
  // out (M, N) = (a * a_scale_inv) @ (b * b_scale_inv)^T + bias: a (M, K), b (N, K), M, N, K > 0.
  void (*fp8_matmul_nt)(const Tensor& out, const Tensor& a, const Tensor& a_scale_inv, const Tensor& b,
                        const Tensor& b_scale_inv, const Tensor& bias, bool fast_accumulation) = nullptr;
  // Delayed scaling's end-of-step update of E entries (framework/tensor/ops/fp8_scale_update.h): history
  // (E, L), amax, scale, fp8_max (E) f32; skip (one f32/f64 element, or undefined) non-finite drops the step.
  void (*fp8_update_scales)(const Tensor& history, const Tensor& amax, const Tensor& scale, const Tensor& fp8_max,
                            int64_t margin, bool most_recent, const Tensor& skip, const Tensor& clipped) = nullptr;
};

// Installs the table for a device type (nullptr removes it). The table must outlive its use.
void register_device_ops(DeviceType type, const DeviceOps* ops);
// The table for a device type, or nullptr when none is registered.
const DeviceOps* find_device_ops(DeviceType type);

// True when `device` is the CPU or its table has `entry`.
template <class Fn>
bool has_kernel(Device device, Fn DeviceOps::*entry) {
  if (device.is_cpu()) return true;
  const DeviceOps* ops = find_device_ops(device.type);
  return ops != nullptr && ops->*entry != nullptr;
}

// The entry for a non-CPU device; throws "<op>: no kernel for device <device> in this build".
template <class Fn>
Fn device_kernel(Device device, Fn DeviceOps::*entry, const char* op) {
  const DeviceOps* ops = find_device_ops(device.type);
  CPF_CHECK(!device.is_cpu() && ops != nullptr && ops->*entry != nullptr, op, ": no kernel for device ", device,
            " in this build");
  return ops->*entry;
}

}  // namespace cpf
