// The fused residual add + norm (framework/tensor/ops/add_norm.h) on the GPU against the CPU reference:
// every kernel path (a warp per row with the row in registers, a block per row in registers, the
// recomputing path for rows that are unaligned or too long), every dtype triple the model uses (f32
// stream with an f32 or bf16 branch and output; f64; bf16 throughout), LayerNorm with and without
// weight/bias, RMSNorm, with and without a branch, with and without the residual gradient; the parameter
// partials the dx kernel writes itself, over many row chunks, and their determinism.
//
// Tolerances as tests/tensor/cuda/nn_test.cpp: f32 sums run in another order on the GPU (a few ulps per term);
// a bf16 result rounds once from f32 values that agree that closely (one bf16 step at most). x1 is one
// rounded add on both sides: equal.
#include <optional>

#include "cuda_test_utils.h"
#include "framework/tensor/ops/add_norm.h"
#include "framework/tensor/ops/views.h"

namespace cpf {
namespace {

using raw::NormKind;
using testing::all_close;
using testing::on_cpu;
using testing::on_gpu;
using testing::random_cpu;

class CudaAddNormTest : public testing::CudaTest {};

double rtol(DType dtype) { return dtype == DType::bf16 ? 1.0 / 128 : (dtype == DType::f64 ? 1e-12 : 1e-5); }
double atol(DType dtype) { return dtype == DType::bf16 ? 1e-3 : (dtype == DType::f64 ? 1e-12 : 1e-5); }
double sum_tol(DType dtype, int64_t rows) {
  return (dtype == DType::f64 ? 1e-15 : 1.2e-7) * static_cast<double>(rows) * 8 + atol(dtype);
}

Tensor maybe_gpu(const Tensor& t) { return t.defined() ? on_gpu(t) : Tensor(); }

struct Dtypes {
  DType x, branch, out;
};

struct Params {
  NormKind kind;
  bool weight, bias, branch, grad_x1;
};

std::vector<Params> param_cases() {
  return {{NormKind::layer_norm, true, true, true, true},   {NormKind::layer_norm, true, false, true, false},
          {NormKind::layer_norm, false, false, true, true}, {NormKind::layer_norm, true, true, false, false},
          {NormKind::rms_norm, true, false, true, true},    {NormKind::rms_norm, false, false, true, false},
          {NormKind::rms_norm, true, false, false, true}};
}

void check_case(const Shape& shape, const Dtypes& d, const Params& p, const std::string& what) {
  const int64_t cols = shape.back(), rows = shape_numel(shape) / cols;
  const Tensor x = random_cpu(shape, d.x, 61, -2, 3);
  const Tensor b = p.branch ? random_cpu(shape, d.branch, 62, -1, 1) : Tensor();
  const Tensor w = p.weight ? random_cpu({cols}, d.x, 63, 0.5, 1.5) : Tensor();
  const Tensor bias = p.bias ? random_cpu({cols}, d.x, 64) : Tensor();
  const raw::AddNormResult ref = raw::add_norm(p.kind, x, b, w, bias, 1e-5, d.out);
  const raw::AddNormResult got =
      raw::add_norm(p.kind, on_gpu(x), maybe_gpu(b), maybe_gpu(w), maybe_gpu(bias), 1e-5, d.out);
  ASSERT_EQ(got.y.device(), Device::cuda(0)) << what;
  ASSERT_EQ(got.y.dtype(), d.out) << what;
  EXPECT_TRUE(all_close(on_cpu(got.x1), ref.x1, 0, 0)) << "x1 " << what;
  EXPECT_TRUE(all_close(on_cpu(got.y), ref.y, atol(d.out), rtol(d.out))) << "y " << what;
  const double stat_tol = d.x == DType::f64 ? 1e-12 : 1e-5;
  EXPECT_TRUE(all_close(on_cpu(got.rstd), ref.rstd, stat_tol, stat_tol)) << "rstd " << what;
  if (p.kind == NormKind::layer_norm) {
    EXPECT_TRUE(all_close(on_cpu(got.mean), ref.mean, stat_tol, stat_tol)) << "mean " << what;
  }

  // Backward from the CPU's statistics on both sides, so only the backward kernels are compared.
  const Tensor gx1 = p.grad_x1 ? random_cpu(shape, d.x, 65) : Tensor();
  const Tensor gy = random_cpu(shape, d.out, 66);
  const std::optional<DType> bd = p.branch ? std::optional<DType>(d.branch) : std::nullopt;
  const raw::AddNormGrads rg =
      raw::add_norm_backward(p.kind, gx1, gy, d.out, ref.x1, w, p.bias, ref.mean, ref.rstd, bd);
  const raw::AddNormGrads gg = raw::add_norm_backward(p.kind, maybe_gpu(gx1), on_gpu(gy), d.out, on_gpu(ref.x1),
                                                      maybe_gpu(w), p.bias, maybe_gpu(ref.mean), on_gpu(ref.rstd), bd);
  const DType xc = d.x == DType::bf16 ? DType::bf16 : d.x;
  EXPECT_TRUE(all_close(on_cpu(gg.dx), rg.dx, atol(xc) * 10, rtol(xc) * 10)) << "dx " << what;
  EXPECT_EQ(gg.dbranch.defined(), p.branch) << what;
  if (p.branch) {
    EXPECT_EQ(gg.dbranch.dtype(), d.branch) << what;
    EXPECT_TRUE(all_close(on_cpu(gg.dbranch), rg.dbranch, atol(d.branch) * 10, rtol(d.branch) * 10)) << "db " << what;
  }
  EXPECT_EQ(gg.dweight.defined(), p.weight) << what;
  if (p.weight) {
    EXPECT_TRUE(all_close(on_cpu(gg.dweight), rg.dweight, sum_tol(d.x, rows), rtol(d.x))) << "dweight " << what;
  }
  EXPECT_EQ(gg.dbias.defined(), p.bias) << what;
  if (p.bias) EXPECT_TRUE(all_close(on_cpu(gg.dbias), rg.dbias, sum_tol(d.x, rows), rtol(d.x))) << "dbias " << what;
}

TEST_F(CudaAddNormTest, MatchesTheCpu) {
  // Forward: (5, 9, 96) and (40, 768): a warp per row, registers; (33, 33): a warp, recomputing (no
  // 16-byte vectors); (4, 7, 96), (3, 768), (6, 3000) and (2, 8192): a block per row in registers (at most
  // 32 rows take a block however short; f64 8192 recomputes); (3, 33), (5, 1) and (3, 1030): a block,
  // recomputing. The backward's dx kernel gives every row up to 1024 columns a warp, and keeps at most 8
  // vectors a thread: (2, 8192) re-reads its 16-byte vectors in f32 and f64.
  const std::vector<Dtypes> dtypes{{DType::f32, DType::f32, DType::f32},  {DType::f32, DType::bf16, DType::f32},
                                   {DType::f32, DType::f32, DType::bf16}, {DType::f32, DType::bf16, DType::bf16},
                                   {DType::f64, DType::f64, DType::f64},  {DType::bf16, DType::bf16, DType::bf16}};
  for (const Shape& shape : {Shape{4, 7, 96}, Shape{5, 9, 96}, Shape{3, 768}, Shape{40, 768}, Shape{3, 33},
                             Shape{33, 33}, Shape{5, 1}, Shape{6, 3000}, Shape{2, 8192}, Shape{3, 1030}}) {
    for (const Dtypes& d : dtypes) {
      for (const Params& p : param_cases()) {
        const std::string what = shape_str(shape) + " x " + dtype_name(d.x) + " branch " + dtype_name(d.branch) +
                                 " y " + dtype_name(d.out) + (p.kind == NormKind::layer_norm ? " layer" : " rms") +
                                 (p.weight ? " w" : "") + (p.bias ? " b" : "") + (p.branch ? " +branch" : "") +
                                 (p.grad_x1 ? " +dx1" : "");
        check_case(shape, d, p, what);
      }
    }
  }
}

TEST_F(CudaAddNormTest, StridedInputsAndDeterministicParameterSums) {
  // Transposed views are made contiguous first; 3000 rows split the parameter sums into chunks.
  const Tensor x = random_cpu({64, 3000}, DType::f32, 71);
  const Tensor b = random_cpu({64, 3000}, DType::bf16, 72);
  const Tensor w = random_cpu({64}, DType::f32, 73, 0.5, 1.5);
  const Tensor xt = raw::transpose(x, 0, 1), bt = raw::transpose(b, 0, 1);  // (3000, 64) strided
  const auto ref = raw::add_norm(NormKind::layer_norm, xt, bt, w, w, 1e-5, DType::bf16);
  const auto got = raw::add_norm(NormKind::layer_norm, raw::transpose(on_gpu(x), 0, 1), raw::transpose(on_gpu(b), 0, 1),
                                 on_gpu(w), on_gpu(w), 1e-5, DType::bf16);
  EXPECT_TRUE(all_close(on_cpu(got.x1), ref.x1, 0, 0));
  EXPECT_TRUE(all_close(on_cpu(got.y), ref.y, atol(DType::bf16), rtol(DType::bf16)));
  const Tensor gy = on_gpu(random_cpu({3000, 64}, DType::bf16, 74));
  const auto a1 = raw::add_norm_backward(NormKind::layer_norm, Tensor(), gy, DType::bf16, got.x1, on_gpu(w), true,
                                         got.mean, got.rstd, DType::bf16);
  const auto a2 = raw::add_norm_backward(NormKind::layer_norm, Tensor(), gy, DType::bf16, got.x1, on_gpu(w), true,
                                         got.mean, got.rstd, DType::bf16);
  EXPECT_TRUE(all_close(on_cpu(a1.dweight), on_cpu(a2.dweight), 0, 0));
  EXPECT_TRUE(all_close(on_cpu(a1.dbias), on_cpu(a2.dbias), 0, 0));
  EXPECT_TRUE(all_close(on_cpu(a1.dx), on_cpu(a2.dx), 0, 0));
}

TEST_F(CudaAddNormTest, ParameterPartialsOfManyChunksMatchTheCpu) {
  // The dx kernel sums each row chunk's parameter partials itself (add_norm_backward.cu); norm.cu folds them.
  // GPT-2's 768 columns (a warp per row, 6 vectors a thread) and 2048 (a block per row), with row counts
  // that end in a short chunk: 9001 rows = 250 chunks of 36 and one of 1; 2500 = 78 of 32 and one of 4.
  const Dtypes mixed{DType::f32, DType::bf16, DType::bf16};
  for (const Shape& shape : {Shape{9001, 768}, Shape{2500, 2048}}) {
    check_case(shape, mixed, {NormKind::layer_norm, true, true, true, true}, shape_str(shape) + " layer");
    check_case(shape, mixed, {NormKind::rms_norm, true, false, true, false}, shape_str(shape) + " rms");
    // Bitwise the same on a second call: fixed chunks, warps folded in order, no atomics.
    const Tensor x1 = on_gpu(random_cpu(shape, DType::f32, 91));
    const Tensor gy = on_gpu(random_cpu(shape, DType::bf16, 92));
    const Tensor w = on_gpu(random_cpu({shape.back()}, DType::f32, 93, 0.5, 1.5));
    const auto stats = raw::add_norm(NormKind::layer_norm, x1, Tensor(), w, w, 1e-5, DType::bf16);
    const auto run = [&] {
      return raw::add_norm_backward(NormKind::layer_norm, x1, gy, DType::bf16, x1, w, true, stats.mean, stats.rstd,
                                    DType::bf16);
    };
    const raw::AddNormGrads a = run(), b = run();
    EXPECT_TRUE(all_close(on_cpu(a.dweight), on_cpu(b.dweight), 0, 0)) << shape_str(shape);
    EXPECT_TRUE(all_close(on_cpu(a.dbias), on_cpu(b.dbias), 0, 0)) << shape_str(shape);
  }
}

TEST_F(CudaAddNormTest, RejectsInputsOnAnotherDevice) {
  const Tensor x = on_gpu(random_cpu({2, 4}, DType::f32, 81));
  EXPECT_CPF_ERROR(
      raw::add_norm(NormKind::rms_norm, x, random_cpu({2, 4}, DType::bf16, 82), Tensor(), Tensor(), 1e-6, DType::bf16),
      "add_rms_norm: branch is on cpu but x is on cuda:0");
  EXPECT_CPF_ERROR(raw::add_norm(NormKind::layer_norm, x, Tensor(), ones({4}), Tensor(), 1e-5, DType::bf16),
                   "add_layer_norm: weight is on cpu but x is on cuda:0");
}

}  // namespace
}  // namespace cpf
