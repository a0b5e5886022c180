// The CP merge kernel (attention/cuda/lse_merge_kernel.cu) against the CPU host loop of
// cp::PartialMerge: three parts folded into one running (out, lse), with rows some parts do not see
// (lse -inf and a garbage out that must not leak), parts in bf16, f32 and f64, and the accumulator
// tensors updated in place. The kernel's contract violations are refused by name. Skips without a GPU.
#include <gtest/gtest.h>

#include <limits>
#include <utility>
#include <vector>

#include "attention/cp/lse_merge.h"
#include "attention/cuda/lse_merge_cuda.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/views.h"
#include "tests/tensor/cuda/cuda_test_utils.h"

namespace cpf {
namespace {

using testing::on_cpu;
using testing::on_gpu;
using testing::random_cpu;

class CudaLseMerge : public testing::CudaTest {};

constexpr int64_t kTokens = 37, kHeads = 3, kDim = 72;  // dim > 64: lanes loop twice over a row

// Part i's lse (H, T): random, with -inf on every (i + 2)-th row (the part saw no key there), in `acc`.
Tensor part_lse(int i, DType acc) {
  std::vector<double> values = random_cpu({kHeads, kTokens}, DType::f64, 50 + i, -3, 3).to_vector<double>();
  for (size_t r = 0; r < values.size(); r += static_cast<size_t>(i + 2)) {
    values[r] = -std::numeric_limits<double>::infinity();
  }
  return raw::to(from_vector(values, {kHeads, kTokens}), acc);
}

// Part i's out (T, H, D); rows with lse -inf hold large values that must not reach the result.
Tensor part_out(int i, DType dtype) { return random_cpu({kTokens, kHeads, kDim}, dtype, 90 + i, -100, 100); }

void expect_parity(DType input, DType part_dtype) {
  cp::PartialMerge cpu(kTokens, kHeads, kDim, input);
  cp::PartialMerge gpu(kTokens, kHeads, kDim, input, Device::cuda(0));
  const DType acc = input == DType::f64 ? DType::f64 : DType::f32;
  const void* out_storage = gpu.out(acc).raw_data();  // out(acc) is the accumulator itself (no conversion)
  const void* lse_storage = gpu.lse().raw_data();
  for (int i = 0; i < 3; ++i) {
    const Tensor o = part_out(i, part_dtype), l = part_lse(i, acc);
    cpu.add(o, l);
    gpu.add(on_gpu(o), on_gpu(l));
  }
  EXPECT_EQ(gpu.out(acc).raw_data(), out_storage) << "the running out was reallocated";
  EXPECT_EQ(gpu.lse().raw_data(), lse_storage) << "the running lse was reallocated";
  const double tol = acc == DType::f64 ? 1e-12 : 1e-5;
  EXPECT_TRUE(testing::all_close(on_cpu(gpu.lse()), cpu.lse(), tol, tol)) << dtype_name(part_dtype);
  EXPECT_TRUE(testing::all_close(on_cpu(gpu.out(acc)), cpu.out(acc), 100 * tol, tol)) << dtype_name(part_dtype);
}

TEST_F(CudaLseMerge, Bf16PartsMatchTheHostLoop) { expect_parity(DType::bf16, DType::bf16); }
TEST_F(CudaLseMerge, F32PartsMatchTheHostLoop) { expect_parity(DType::f32, DType::f32); }
TEST_F(CudaLseMerge, F64PartsMatchTheHostLoop) { expect_parity(DType::f64, DType::f64); }

// Devices without a registered kernel merge with element-wise raw ops: the same results, in place too.
TEST_F(CudaLseMerge, TheRawOpFallbackMatchesTheHostLoop) {
  const cp::DeviceMergeFn kernel = cp::device_merge(DeviceType::cuda);
  cp::register_device_merge(DeviceType::cuda, nullptr);
  expect_parity(DType::bf16, DType::bf16);
  expect_parity(DType::f64, DType::f64);
  cp::register_device_merge(DeviceType::cuda, kernel);
}

TEST_F(CudaLseMerge, TheKernelIsRegisteredForCuda) {
  EXPECT_EQ(cp::device_merge(DeviceType::cuda), &attention_cuda::lse_merge);
}

TEST_F(CudaLseMerge, RefusesTensorsOutsideItsContract) {
  const Tensor acc = on_gpu(zeros({kTokens, kHeads, kDim}));
  const Tensor lse = on_gpu(zeros({kHeads, kTokens}));
  EXPECT_CPF_ERROR(
      attention_cuda::lse_merge(acc, lse, on_gpu(zeros({kTokens, kHeads, kDim}, {.dtype = DType::i32})), lse),
      "cp merge (cuda): the part's out must be f32, f64 or bf16, got i32");
  EXPECT_CPF_ERROR(attention_cuda::lse_merge(acc, on_gpu(zeros({kHeads, kTokens}, {.dtype = DType::f64})),
                                             on_gpu(zeros({kTokens, kHeads, kDim})), lse),
                   "must share an f32/f64 dtype: out f32, lse f64");
  EXPECT_CPF_ERROR(attention_cuda::lse_merge(acc, lse, on_gpu(zeros({kTokens, kHeads, 8})), lse),
                   "out (T, H, D) and lse (H, T) expected");
}

// The ring backward's dQ accumulation: acc += part in one pass reading the part in its own dtype,
// against the CPU's raw ops (the part converted, then added); the accumulator stays the same tensor.
TEST_F(CudaLseMerge, AccumulateMatchesTheCpu) {
  for (const auto& [acc_dtype, part_dtype] :
       {std::pair{DType::f32, DType::bf16}, std::pair{DType::f32, DType::f32}, std::pair{DType::f32, DType::f64},
        std::pair{DType::f64, DType::f64}, std::pair{DType::f64, DType::bf16}}) {
    const Tensor start = random_cpu({kTokens, kHeads, kDim}, acc_dtype, 3);
    const Tensor part = random_cpu({kTokens, kHeads, kDim}, part_dtype, 4, -50, 50);
    const Tensor cpu = raw::clone(start);
    cp::accumulate(cpu, part);
    const Tensor gpu = on_gpu(start);
    const void* storage = gpu.raw_data();
    cp::accumulate(gpu, on_gpu(part));
    cp::accumulate(cpu, part);  // twice: the second add reads the first one's result
    cp::accumulate(gpu, on_gpu(part));
    EXPECT_EQ(gpu.raw_data(), storage) << "the accumulator was reallocated";
    const double tol = acc_dtype == DType::f64 ? 1e-12 : 1e-5;
    EXPECT_TRUE(testing::all_close(on_cpu(gpu), cpu, tol, tol))
        << dtype_name(acc_dtype) << " += " << dtype_name(part_dtype);
  }
  EXPECT_EQ(cp::device_accumulate(DeviceType::cuda), &attention_cuda::accumulate);
}

TEST_F(CudaLseMerge, AccumulateRefusesTensorsOutsideItsContract) {
  const Tensor acc = on_gpu(zeros({kTokens, kHeads, kDim}));
  EXPECT_CPF_ERROR(attention_cuda::accumulate(acc, on_gpu(zeros({kTokens, kHeads, kDim}, {.dtype = DType::i32}))),
                   "cp accumulate (cuda): the part must be f32, f64 or bf16, got i32");
  EXPECT_CPF_ERROR(attention_cuda::accumulate(raw::to(acc, DType::bf16), acc),
                   "cp accumulate (cuda): the accumulator must be f32 or f64, got bf16");
  EXPECT_CPF_ERROR(attention_cuda::accumulate(acc, on_gpu(zeros({kTokens, kHeads, 8}))),
                   "cp accumulate (cuda): part [37,3,8] does not match the accumulator [37,3,72]");
  EXPECT_CPF_ERROR(attention_cuda::accumulate(on_gpu(zeros({4, 4})), raw::transpose(on_gpu(zeros({4, 4})), 0, 1)),
                   "cp accumulate (cuda): both tensors must be contiguous");
}

}  // namespace
}  // namespace cpf
