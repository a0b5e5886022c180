// Reductions on the GPU against the CPU: every op, dims leading/trailing/middle/all, short rows (a
// warp per row), long rows (a block per row) and very long ones split across blocks, and leading dims
// folded as columns in place.
#include <cmath>

#include "cuda_test_utils.h"
#include "framework/tensor/ops/reduce.h"
#include "framework/tensor/ops/views.h"

namespace cpf {
namespace {

using testing::all_close;
using testing::on_cpu;
using testing::on_gpu;
using testing::random_cpu;

class CudaReduceTest : public testing::CudaTest {};

// Summation order differs between the CPU (Eigen's vectorised lanes) and the GPU (per-thread runs,
// then a tree), so f32 sums agree up to rounding that grows with the number of terms: allow
// R * 2^-24 * max|x| absolutely (a bound for any order) on top of the element-wise tolerance.
double sum_atol(DType dtype, int64_t terms) {
  const double eps = dtype == DType::f64 ? 1.1e-16 : 6e-8;  // bf16 sums accumulate in f32 too
  return static_cast<double>(terms) * eps + 1e-6;
}

TEST_F(CudaReduceTest, EveryOpOverEveryDimChoice) {
  const Shape shape{6, 70, 33};
  const std::vector<std::vector<int64_t>> dim_sets{{}, {0}, {1}, {2}, {-1}, {0, 2}, {0, 1}};
  for (DType dtype : {DType::f32, DType::f64, DType::bf16}) {
    Tensor x = random_cpu(shape, dtype, 21, -3, 3);
    Tensor gx = on_gpu(x);
    for (const auto& dims : dim_sets) {
      for (bool keepdim : {false, true}) {
        int64_t terms = 1;
        for (int64_t d : (dims.empty() ? std::vector<int64_t>{0, 1, 2} : dims)) terms *= shape[(d + 3) % 3];
        const double rtol = testing::rtol_for(dtype), atol = sum_atol(dtype, terms) * 3;
        const std::string what = dtype_name(dtype) + " dims " + shape_str(dims) + (keepdim ? " keepdim" : "");
        EXPECT_TRUE(all_close(on_cpu(raw::sum(gx, dims, keepdim)), raw::sum(x, dims, keepdim), atol, rtol))
            << "sum " << what;
        EXPECT_TRUE(all_close(on_cpu(raw::mean(gx, dims, keepdim)), raw::mean(x, dims, keepdim), atol, rtol))
            << "mean " << what;
        EXPECT_TRUE(all_close(on_cpu(raw::amax(gx, dims, keepdim)), raw::amax(x, dims, keepdim), 0, 0))
            << "amax " << what;
        EXPECT_TRUE(all_close(on_cpu(raw::logsumexp(gx, dims, keepdim)), raw::logsumexp(x, dims, keepdim),
                              testing::atol_for(dtype) * 10, std::max(rtol, 1e-5)))
            << "logsumexp " << what;
      }
    }
    for (int64_t d = 0; d < 3; ++d) {
      EXPECT_TRUE(all_close(on_cpu(raw::argmax(gx, d)), raw::argmax(x, d), 0, 0)) << "argmax " << d;
      EXPECT_TRUE(all_close(on_cpu(raw::argmax(gx, d, true)), raw::argmax(x, d, true), 0, 0)) << "argmax keepdim";
    }
  }
}

TEST_F(CudaReduceTest, LongRowsAreSplitAcrossBlocks) {
  // One row of 3M: split into chunks whose partials a second kernel combines. 4 rows of 100k: a block
  // each, split as well. 5000 rows of 2000: a block per row, no split.
  for (const Shape& shape : {Shape{3000000}, Shape{4, 100000}, Shape{5000, 2000}}) {
    Tensor x = random_cpu(shape, DType::f32, 22, -1, 1);
    Tensor gx = on_gpu(x);
    Tensor ref = raw::sum(raw::to(x, DType::f64), {-1});
    const int64_t terms = shape.back();
    EXPECT_TRUE(all_close(on_cpu(raw::sum(gx, {-1})), ref, sum_atol(DType::f32, terms), 1e-5)) << shape_str(shape);
    EXPECT_TRUE(all_close(on_cpu(raw::amax(gx, {-1})), raw::amax(x, {-1}), 0, 0));
    EXPECT_TRUE(all_close(on_cpu(raw::logsumexp(gx, {-1})), raw::logsumexp(raw::to(x, DType::f64), {-1}), 1e-5, 1e-5));
    EXPECT_TRUE(all_close(on_cpu(raw::argmax(gx, -1)), raw::argmax(x, -1), 0, 0));
  }
}

TEST_F(CudaReduceTest, LeadingDimsFoldAsColumnsInPlace) {
  // Reductions over leading dims of a contiguous tensor (a bias gradient dY (T, C).sum(0)) fold the
  // columns in place, split into row chunks whose partials combine in order: a GPT-2 bias gradient,
  // a ragged tile, few columns over many rows, one row, and two leading dims.
  const std::vector<std::pair<Shape, std::vector<int64_t>>> cases{
      {{32768, 768}, {0}}, {{4099, 33}, {0}}, {{100000, 3}, {0}}, {{1, 5}, {0}}, {{8, 512, 40}, {0, 1}}};
  for (DType dtype : {DType::f32, DType::bf16, DType::f64}) {
    for (const auto& [shape, dims] : cases) {
      Tensor x = random_cpu(shape, dtype, 23, -1, 1);
      Tensor gx = on_gpu(x);
      int64_t terms = 1;
      for (int64_t d : dims) terms *= shape[static_cast<size_t>(d)];
      const double atol = sum_atol(dtype, terms), rtol = testing::rtol_for(dtype);
      const std::string what = dtype_name(dtype) + " " + shape_str(shape);
      EXPECT_TRUE(all_close(on_cpu(raw::sum(gx, dims)), raw::sum(x, dims), atol, rtol)) << "sum " << what;
      EXPECT_TRUE(all_close(on_cpu(raw::mean(gx, dims, true)), raw::mean(x, dims, true), atol, rtol))
          << "mean " << what;
      EXPECT_TRUE(all_close(on_cpu(raw::amax(gx, dims)), raw::amax(x, dims), 0, 0)) << "amax " << what;
    }
  }
  // A NaN or +inf in a column decides its amax; -inf columns stay -inf.
  const float inf = INFINITY;
  Tensor special = from_vector<float>({1, -inf, 2, NAN, -inf, inf, 3, -inf, 0}, {3, 3});
  EXPECT_TRUE(all_close(on_cpu(raw::amax(on_gpu(special), {0})), raw::amax(special, {0}), 0, 0));
  EXPECT_TRUE(all_close(on_cpu(raw::sum(on_gpu(special), {0})), raw::sum(special, {0}), 0, 0));
}

TEST_F(CudaReduceTest, SpecialValuesAndEmptyDims) {
  const float inf = INFINITY;
  // Rows: all -inf, a +inf, a NaN, ordinary with ties for argmax.
  Tensor x = from_vector<float>({-inf, -inf, -inf, 1, inf, 2, 1, NAN, 3, 5, 2, 5}, {4, 3});
  EXPECT_TRUE(all_close(on_cpu(raw::logsumexp(on_gpu(x), {1})), raw::logsumexp(x, {1}), 1e-6, 1e-6));
  EXPECT_TRUE(all_close(on_cpu(raw::amax(on_gpu(x), {1})), raw::amax(x, {1}), 0, 0));
  Tensor ties = from_vector<float>({5, 2, 5, 1, 1, 1}, {2, 3});
  EXPECT_EQ(on_cpu(raw::argmax(on_gpu(ties), 1)).to_vector<int64_t>(), (std::vector<int64_t>{0, 0}));
  // Reducing a dim of size 0: sum 0, mean NaN, logsumexp -inf (as on the CPU).
  Tensor e = zeros({3, 0}, {.device = Device::cuda()});
  EXPECT_TRUE(all_close(on_cpu(raw::sum(e, {1})), raw::sum(zeros({3, 0}), {1}), 0, 0));
  EXPECT_TRUE(all_close(on_cpu(raw::mean(e, {1})), raw::mean(zeros({3, 0}), {1}), 0, 0));
  EXPECT_TRUE(all_close(on_cpu(raw::logsumexp(e, {1})), raw::logsumexp(zeros({3, 0}), {1}), 0, 0));
  EXPECT_CPF_ERROR(raw::amax(e, {1}), "amax: cannot reduce over dim 1 of size 0");
  // sum_to (the gradient of a broadcast) runs through sum.
  Tensor g = random_cpu({4, 5, 6}, DType::f32, 23);
  EXPECT_TRUE(all_close(on_cpu(raw::sum_to(on_gpu(g), {5, 1})), raw::sum_to(g, {5, 1}), 1e-5, 1e-5));
}

}  // namespace
}  // namespace cpf
