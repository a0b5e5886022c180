#pragma once
// Launchers of the CUDA kernels and their parameter blocks (private to framework/tensor/cuda).
//
// This header is shared by the .cu files (nvcc) and the C++ glue (ops.cpp, g++), so it holds only
// plain structs: the glue turns Tensors into these, the .cu files never see framework types, which
// keeps nvcc's work small. Op codes are the integer values of the raw:: enums (UnaryOp, BinaryOp,
// CompareOp, DeviceReduceOp, DeviceSoftmaxOp) and dtype codes those of cpf::DType.
#include <cuda_runtime.h>

#include <cstdint>

#include "framework/tensor/rope_frequencies.h"

namespace cpf::cuda::kernels {

inline constexpr int kMaxDims = 12;
inline constexpr int kMaxOperands = 4;
inline constexpr int kThreads = 256;

// cpf::DType's order.
enum DtypeCode : int { kF32 = 0, kF64 = 1, kBF16 = 2, kI32 = 3, kI64 = 4, kBool = 5 };

// Op codes, in the order of raw::UnaryOp, raw::BinaryOp, raw::CompareOp, DeviceReduceOp and
// DeviceSoftmaxOp; ops.cpp checks every value against its enum at compile time.
enum UnaryCode : int {
  kNeg,
  kExp,
  kLog,
  kSqrt,
  kRsqrt,
  kTanh,
  kGelu,
  kSilu,
  kRelu,
  kSigmoid,
  kAbs,
  kSquare,
  kReciprocal
};
enum BinaryCode : int { kAdd, kSub, kMul, kDiv, kPow, kMaximum, kMinimum };
enum CompareCode : int { kEq, kNe, kLt, kLe, kGt, kGe };
enum ReduceCode : int { kSum, kMean, kAmax, kLogsumexp, kArgmax };
enum SoftmaxCode : int { kSoftmax, kLogSoftmax, kSoftmaxBackward, kLogSoftmaxBackward };

// Division by a fixed divisor d < 2^31 as a multiply-high and a shift (valid for n < 2^31).
struct FastDivmod {
  uint32_t divisor = 1, magic = 0, shift = 0;
};

// The iteration of an element-wise op over the output's shape; operand 0 is the output. Built on the
// host with size-1 dims dropped and contiguous runs of dims merged; strides are in elements (0 along
// broadcast dims). `linear`: one dim left and every stride is 0 or 1, so the kernel indexes with the
// flat position alone. `vectorize`: runs of vector_width elements along the innermost dim start
// 16-byte aligned in every operand whose innermost stride is 1 (the others have stride 0 there), and
// the innermost size is a multiple of the width (not needed when linear: the tail is handled), so
// whole vectors are loaded and stored.
struct Iter {
  int ndim = 0;
  int nops = 0;
  int64_t numel = 0;
  bool linear = false;
  bool vectorize = false;
  bool index32 = false;  // numel < 2^31: the strided kernel may use the 32-bit divisions below
  int64_t sizes[kMaxDims] = {};
  FastDivmod divs[kMaxDims] = {};
  int64_t strides[kMaxOperands][kMaxDims] = {};
  void* data[kMaxOperands] = {};
  int dtype[kMaxOperands] = {};
  int grid = 1;  // blocks to launch (grid-stride loops)
};

// Elements per vector in the linear kernels: 16 bytes of the widest operand.
inline constexpr int vector_width(int max_element_size) { return max_element_size >= 16 ? 1 : 16 / max_element_size; }

// Element-wise families (operands after the output, in order):
void launch_copy(const Iter& it, cudaStream_t stream);                    // in (dtype converted)
void launch_fill(const Iter& it, double value, cudaStream_t stream);      // none
void launch_unary(int op, const Iter& it, cudaStream_t stream);           // x
void launch_unary_backward(int op, const Iter& it, cudaStream_t stream);  // grad, x, y
// a, b. op may also be kAddScaled (out = a + alpha * b, rounded like the CPU's add_). For integer
// division, *div_by_zero (device memory) is set to 1 when a divisor is zero.
inline constexpr int kAddScaled = 100;
void launch_binary(int op, const Iter& it, double alpha, int* div_by_zero, cudaStream_t stream);
void launch_compare(int op, const Iter& it, cudaStream_t stream);      // a, b -> bool
void launch_where(const Iter& it, cudaStream_t stream);                // cond, a, b
void launch_scale(const Iter& it, double value, cudaStream_t stream);  // x (out = x * value, as mul_)

// rows (K, R) contiguous of dtype -> out (K) of dtype (i64 for argmax). `workspace` holds
// reduce_workspace_bytes(...) bytes (may be null when that is 0).
size_t reduce_workspace_bytes(int dtype, int64_t rows, int64_t cols, int sm_count);
void launch_reduce_rows(int op, int dtype, const void* in, void* out, int64_t rows, int64_t cols, void* workspace,
                        int sm_count, cudaStream_t stream);
// in (R, K) contiguous of dtype -> out (K) of dtype, folded over R; op is sum, mean or amax.
size_t reduce_cols_workspace_bytes(int dtype, int64_t rows, int64_t cols, int sm_count);
void launch_reduce_cols(int op, int dtype, const void* in, void* out, int64_t rows, int64_t cols, void* workspace,
                        int sm_count, cudaStream_t stream);

// (outer, size, inner) contiguous; b is null for the forward ops.
void launch_softmax(int op, int dtype, const void* a, const void* b, void* out, int64_t outer, int64_t size,
                    int64_t inner, int sm_count, cudaStream_t stream);

// ---- nn kernels (norm.cu, index.cu, rope.cu); pointers to contiguous buffers unless an Iter says otherwise ----

// LayerNorm (centered) / RMSNorm rows (rows, cols) of dtype; mean (centered only) and rstd in the compute type.
void launch_norm(bool centered, int dtype, const void* x, const void* w, const void* b, void* y, void* mean, void* rstd,
                 int64_t rows, int64_t cols, double eps, cudaStream_t stream);
// Workspace for the parameter gradients' row-chunk partials (0 when neither is wanted).
size_t norm_backward_workspace_bytes(int dtype, int64_t rows, int64_t cols);
void launch_norm_backward(bool centered, int dtype, const void* g, const void* x, const void* w, const void* mean,
                          const void* rstd, void* dx, void* dw, void* db, int64_t rows, int64_t cols, void* workspace,
                          cudaStream_t stream);
// The parameter gradients alone (workspace as above, for x_dtype), from a gradient g of x_dtype or, with an f32
// x, bf16.
void launch_norm_param_grads(bool centered, int g_dtype, int x_dtype, const void* g, const void* x, const void* mean,
                             const void* rstd, void* dw, void* db, int64_t rows, int64_t cols, void* workspace,
                             cudaStream_t stream);
// The partials' layout in that workspace: slot k (of ceil(rows / norm_param_chunk_rows(rows))) sums rows
// [k * chunk, (k + 1) * chunk); dw's slots (chunks, cols) in the compute type, then db's. The fold adds a
// column's slots in a fixed order into dw / db (null: skipped), so kernels that write the partials themselves
// (add_norm_backward.cu) get the same deterministic sums.
int64_t norm_param_chunk_rows(int64_t rows);
void launch_norm_param_fold(int x_dtype, const void* workspace, void* dw, void* db, int64_t rows, int64_t cols,
                            cudaStream_t stream);
// The residual add fused with the norm (add_norm.cu): x1 = x + b (b null: no add, x1 unused), y = norm(x1) in
// y_dtype. x, w, bias, x1 of x_dtype; b_dtype and y_dtype are x_dtype or, with an f32 x, kBF16.
void launch_add_norm(bool centered, int x_dtype, int b_dtype, int y_dtype, const void* x, const void* b, const void* w,
                     const void* bias, void* x1, void* y, void* mean, void* rstd, int64_t rows, int64_t cols,
                     double eps, cudaStream_t stream);
// Its backward (add_norm_backward.cu): dx = dx1 (null: 0) + the norm's input gradient of g (g_dtype); db
// (db_dtype, null: none) = dx converted; dw, dbias (null: none) summed as launch_norm_backward does, in `workspace`.
void launch_add_norm_backward(bool centered, int x_dtype, int g_dtype, int db_dtype, const void* g, const void* x1,
                              const void* w, const void* mean, const void* rstd, const void* dx1, void* dx, void* db,
                              void* dw, void* dbias, int64_t rows, int64_t cols, void* workspace, cudaStream_t stream);

// Few-row GEMM (gemv.cu): out (m, n) = a (m, k; row stride lda) @ w (n, k)^T [+ bias (n)], all of dtype
// (kF32 or kBF16), out contiguous; gelu: aux = the rounded pre-activation, out = GELU(aux). m <= kGemvMaxRows;
// k, lda and every pointer allow 16-byte loads.
inline constexpr int kGemvMaxRows = 8;
struct GemvLaunch {
  int dtype = kF32;
  const void* a = nullptr;
  const void* w = nullptr;
  const void* bias = nullptr;
  void* out = nullptr;
  void* aux = nullptr;
  int64_t m = 0, n = 0, k = 0, lda = 0;
  bool gelu = false;
};
void launch_gemv(const GemvLaunch& g, cudaStream_t stream);

// dst[i] (bf16) = src[i] (f32), n[i] elements each, for i < count (host arrays): one launch per 64 pairs
// (cast_many.cu).
void launch_cast_f32_bf16_many(const void* const* src, void* const* dst, const int64_t* n, int count, int sm_count,
                               cudaStream_t stream);
// Cross-entropy rows (rows, cols) of dtype; targets of index dtype it_dtype (kI32/kI64).
void launch_cross_entropy(int dtype, int it_dtype, const void* logits, const void* targets, void* lse, double* row_loss,
                          int64_t rows, int64_t cols, int64_t ignore_index, cudaStream_t stream);
// scale = grad_loss / count: given on the host (`scale`), or on the device when grad_loss (f64, 1) and count
// (i64, 1) are device pointers (then `scale` is ignored).
void launch_cross_entropy_backward(int dtype, int it_dtype, const void* logits, const void* targets, const void* lse,
                                   void* out, int64_t rows, int64_t cols, double scale, const double* grad_loss,
                                   const int64_t* count, int64_t ignore_index, cudaStream_t stream);
// loss (1, kF32 or kF64) = mean of row_loss (rows, f64) over the rows whose target is not ignore_index, 0 when
// there are none; count (1, i64) = their number. One block, fixed summation order.
void launch_cross_entropy_loss(int loss_dtype, int it_dtype, const double* row_loss, const void* targets, int64_t rows,
                               int64_t ignore_index, void* loss, int64_t* count, cudaStream_t stream);
// The fused classifier (classifier_loss.cu): row losses and, with write_grad, dlogits in place over logits
// (rows, cols) of dtype; labels of index dtype it_dtype.
void launch_classifier_rows(int dtype, int it_dtype, void* logits, const void* labels, double* row_loss, int64_t rows,
                            int64_t cols, double scale, const double* divisor, bool write_grad, int64_t ignore_index,
                            cudaStream_t stream);

// RoPE over x (B, T, H, D) with element strides sb, st, sh (unit stride along D); out contiguous.
// positions: (T) or (B, T) (per_batch) of index dtype pos_dtype.
void launch_rope(int dtype, int pos_dtype, const void* x, const void* positions, void* out, int64_t batch, int64_t seq,
                 int64_t heads, int64_t dim, int64_t sb, int64_t st, int64_t sh, bool per_batch,
                 const RopeFrequencies& frequencies, int64_t rotary_dim, bool inverse, cudaStream_t stream);

// SwiGLU's gate (swiglu.cu) over (rows, cols) row-strided operands (element row strides gs, us, dys, dgs,
// dus); out contiguous.
void launch_swiglu(int dtype, const void* g, int64_t gs, const void* u, int64_t us, void* out, int64_t rows,
                   int64_t cols, cudaStream_t stream);
void launch_swiglu_backward(int dtype, const void* dy, int64_t dys, const void* g, int64_t gs, const void* u,
                            int64_t us, void* dg, int64_t dgs, void* du, int64_t dus, int64_t rows, int64_t cols,
                            cudaStream_t stream);

// Gather over an Iter of (out, index, x): out[o] = x[x_off + index[i_off] * x_step]; elem_size bytes.
// Indices outside [0, x_bound) (x's size along the dim) read nothing and give 0.
void launch_gather(const Iter& it, int elem_size, int index_dtype, int64_t x_step, int64_t x_bound,
                   cudaStream_t stream);
// Per line of an Iter of (acc, index, src): for j in [0, len): acc[index[j * index_step] * acc_step] +=
// src[j * src_step]. acc_dtype/src_dtype: equal, or kF32 with kBF16.
void launch_scatter_lines(const Iter& it, int acc_dtype, int src_dtype, int index_dtype, int64_t len, int64_t acc_step,
                          int64_t index_step, int64_t src_step, int64_t acc_bound,
                          cudaStream_t stream);  // indices outside [0, acc_bound) are skipped
// Per line of an Iter of (dst, index, src): for j in [0, len) in order: dst[index[j * index_step] * dst_step] =
// src[j * src_step] (elem_size bytes; the last of repeated indices wins; indices outside [0, dst_bound) skipped).
void launch_copy_lines(const Iter& it, int elem_size, int index_dtype, int64_t len, int64_t dst_step,
                       int64_t index_step, int64_t src_step, int64_t dst_bound, cudaStream_t stream);
// The embedding gradient (embedding_backward.cu): out (rows, cols) compute type of dtype, row v = the sum
// of the rows i of grad (n, cols) with ids[i] == v (ids i32/i64; out-of-range ids are
// skipped), in the order of framework/tensor/ops/embedding_segment.h. workspace:
// embedding_backward_workspace(n, rows, cols, dtype) bytes of device memory.
size_t embedding_backward_workspace(int64_t n, int64_t rows, int64_t cols, int dtype);
void launch_embedding_backward(int dtype, int id_dtype, const void* grad, const void* ids, void* out, int64_t n,
                               int64_t rows, int64_t cols, void* workspace, cudaStream_t stream);

// ---- random and optimizer kernels (random.cu, optim.cu) ----

inline constexpr int kPhiloxUniform = 0, kPhiloxNormal = 1, kPhiloxRandint = 2;  // DeviceRandomOp's order
struct PhiloxParams {
  int op = kPhiloxUniform;
  int dtype = kF32;  // the target dtype (uniform's rounding below b)
  uint64_t seed = 0, first = 0;
  double a = 0.0, b = 0.0;
  int64_t low = 0;
  uint64_t span = 1;
};
// out (n) f64: element i from Philox block (seed, first + i), as random.cpp computes it on the CPU.
void launch_philox(const PhiloxParams& params, double* out, int64_t n, int sm_count, cudaStream_t stream);

// Multi-tensor work is split into chunks of kChunk elements; a block takes one chunk.
inline constexpr int64_t kChunk = 8192;
// The sum of squares reads one array: longer chunks (fewer blocks and partials) amortise each block's
// reduction, which kept the bf16 gradient norm at 66% of the copy bandwidth with 8192.
inline constexpr int64_t kSquaresChunk = 32768;
struct ChunkRef {
  int32_t tensor;  // index into the tensor list
  int64_t begin;   // first element of the chunk
};

// Sum of squares: tensors (device pointers, numel, dtype code) and their chunks, both in device memory
// (`nchunks` entries); partials holds nchunks doubles; out[0] = the f64 sum, combined in chunk order.
struct SquaresTensor {
  const void* data;
  int64_t numel;
  int dtype;
  int aligned;  // data 16-byte aligned: 16-byte vector loads
};
void launch_sum_squares(const SquaresTensor* tensors, const ChunkRef* chunks, int64_t nchunks, double* partials,
                        double* out, cudaStream_t stream);

// Fused AdamW over tensors of one parameter dtype (kF32, kBF16: f32 state; kF64: f64 state).
struct AdamWTensor {
  void* param;
  const void* grad;
  void* exp_avg;
  void* exp_avg_sq;
  int64_t numel;
  double decay;  // 1 - lr * weight_decay, or exactly 1 with decay off (no multiplication)
  int has_decay;
  int aligned;  // every pointer aligned to 4 of its elements: 4-element vector accesses
};
struct AdamWScalars {
  double beta1, one_minus_beta1, beta2, one_minus_beta2, inv_sqrt_bc2, eps, step_size;  // step_size = -lr / bc1
  // A gradient sum of squares in device memory: the step changes nothing when its square root is not
  // finite (the skip decided on the device, without a read-back). Null: always applied.
  const double* skip_if_nonfinite;
  // Deferred steps: null, or the device's count c of applied steps; the step taken is c + 1 = first_step + j,
  // its step_size and inv_sqrt_bc2 being candidate_scalars[2j] and [2j + 1] (0 <= j < candidates, else a trap).
  const int64_t* applied_steps;
  const double* candidate_scalars;
  int64_t first_step, candidates;
};
void launch_adamw(int dtype, const AdamWTensor* tensors, const ChunkRef* chunks, int64_t nchunks, const AdamWScalars& s,
                  cudaStream_t stream);
// The device's count of applied steps (AdamWScalars::applied_steps): set to `value`; or + 1 when the square
// root of *skip_if_nonfinite is finite (or it is null), the AdamW kernel's rule.
void launch_set_applied_steps(int64_t* count, int64_t value, cudaStream_t stream);
void launch_count_applied(int64_t* count, const double* skip_if_nonfinite, cudaStream_t stream);

// Gradient clipping decided on the device: norm = sqrt(sum_squares[0]); when it is finite and > max_norm,
// every element of the tensors (chunks of kChunk) is multiplied in place by max_norm / (norm + 1e-6),
// rounded as mul_ rounds; otherwise nothing is written. One launch whatever the tensors' dtypes.
struct ScaleTensor {
  void* data;
  int64_t numel;
  int dtype;
  int aligned;  // data aligned to 4 elements: 4-element vector accesses
};
void launch_clip_by_norm(const ScaleTensor* tensors, const ChunkRef* chunks, int64_t nchunks, const double* sum_squares,
                         double max_norm, cudaStream_t stream);

}  // namespace cpf::cuda::kernels
