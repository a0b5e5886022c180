#pragma once
// Launchers of the CUDA kernels and their parameter blocks (private to framework/tensor/cuda).
//
// This header is shared by the .cu files (nvcc) and the C++ glue (ops.cpp, g++), so it holds only
// plain structs: the glue turns Tensors into these, the .cu files never see framework types, which
// keeps nvcc's work small. Op codes are the integer values of the raw:: enums (UnaryOp, BinaryOp,
// CompareOp, DeviceReduceOp, DeviceSoftmaxOp) and dtype codes those of cpf::DType.
#include <cuda_runtime.h>

#include <cstdint>

namespace cpf::cuda::kernels {

inline constexpr int kMaxDims = 12;
inline constexpr int kMaxOperands = 4;
inline constexpr int kThreads = 256;

// cpf::DType's order.
enum DtypeCode : int { kF32 = 0, kF64 = 1, kBF16 = 2, kI32 = 3, kI64 = 4, kBool = 5 };

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
void launch_copy(const Iter& it, cudaStream_t stream);                 // in (dtype converted)
void launch_fill(const Iter& it, double value, cudaStream_t stream);   // none
void launch_unary(int op, const Iter& it, cudaStream_t stream);        // x
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

// (outer, size, inner) contiguous; b is null for the forward ops.
void launch_softmax(int op, int dtype, const void* a, const void* b, void* out, int64_t outer, int64_t size,
                    int64_t inner, int sm_count, cudaStream_t stream);

}  // namespace cpf::cuda::kernels
