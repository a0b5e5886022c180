// LayerNorm / RMSNorm, cross-entropy and RoPE on the GPU against the CPU ops (the reference): rows
// short enough for a warp and long enough for a block, with and without affine parameters, strided
// inputs, ignored targets, every floating dtype.
//
// Tolerances: f32 sums run in another order on the GPU (warp trees vs Eigen lanes), so results agree
// to a few f32 ulps per term summed (1e-5 relative here); bf16 results round once from f32 values that
// agree that closely, so they land at most one bf16 step (2^-7 relative) apart.
#include <cmath>

#include "cuda_test_utils.h"
#include "framework/tensor/ops/cross_entropy.h"
#include "framework/tensor/ops/norm.h"
#include "framework/tensor/ops/rope.h"
#include "framework/tensor/ops/views.h"

namespace cpf {
namespace {

using testing::all_close;
using testing::on_cpu;
using testing::on_gpu;
using testing::random_cpu;
using testing::rel_error;

class CudaNnTest : public testing::CudaTest {};

double rtol(DType dtype) { return dtype == DType::bf16 ? 1.0 / 128 : (dtype == DType::f64 ? 1e-12 : 1e-5); }
double atol(DType dtype) { return dtype == DType::bf16 ? 1e-3 : (dtype == DType::f64 ? 1e-12 : 1e-5); }
// Parameter gradients sum over every row: allow rows * ulp on top.
double sum_tol(DType dtype, int64_t rows) {
  return (dtype == DType::f64 ? 1e-15 : 1.2e-7) * static_cast<double>(rows) * 8 + atol(dtype);
}

Tensor maybe(const Tensor& t) { return t.defined() ? on_gpu(t) : Tensor(); }

TEST_F(CudaNnTest, LayerNormAndRmsNormMatchTheCpu) {
  // (4, 7, 100): a warp per row; (6, 3000): a block per row, held in registers (f32 8, bf16 4, f64 16
  // vectors per thread, some padding); (2, 8192): registers for f32 (16) and bf16 (8), three passes for
  // f64; (3, 1030): three passes (no 16-byte vectors for f32/bf16); (5, 1): one column.
  for (const Shape& shape : {Shape{4, 7, 100}, Shape{6, 3000}, Shape{2, 8192}, Shape{3, 1030}, Shape{5, 1}}) {
    const int64_t cols = shape.back(), rows = shape_numel(shape) / cols;
    for (DType dtype : {DType::f32, DType::f64, DType::bf16}) {
      for (bool affine : {true, false}) {
        const std::string what = dtype_name(dtype) + " " + shape_str(shape) + (affine ? " affine" : "");
        Tensor x = random_cpu(shape, dtype, 41, -2, 3);
        Tensor g = random_cpu(shape, dtype, 42);
        Tensor w = affine ? random_cpu({cols}, dtype, 43, 0.5, 1.5) : Tensor();
        Tensor b = affine ? random_cpu({cols}, dtype, 44) : Tensor();

        const auto ref = raw::layer_norm(x, w, b, 1e-5);
        const auto got = raw::layer_norm(on_gpu(x), maybe(w), maybe(b), 1e-5);
        EXPECT_EQ(got.y.device(), Device::cuda(0));
        EXPECT_TRUE(all_close(on_cpu(got.y), ref.y, atol(dtype), rtol(dtype))) << "layer_norm y " << what;
        EXPECT_TRUE(all_close(on_cpu(got.mean), ref.mean, 1e-5, 1e-5)) << "layer_norm mean " << what;
        EXPECT_TRUE(all_close(on_cpu(got.rstd), ref.rstd, 1e-5, 1e-5)) << "layer_norm rstd " << what;
        const auto rg = raw::layer_norm_backward(g, x, w, ref.mean, ref.rstd);
        const auto gg = raw::layer_norm_backward(on_gpu(g), on_gpu(x), maybe(w), on_gpu(ref.mean), on_gpu(ref.rstd));
        EXPECT_TRUE(all_close(on_cpu(gg.dx), rg.dx, atol(dtype) * 10, rtol(dtype) * 10)) << "layer_norm dx " << what;
        EXPECT_TRUE(all_close(on_cpu(gg.dbias), rg.dbias, sum_tol(dtype, rows), rtol(dtype))) << "dbias " << what;
        EXPECT_EQ(gg.dweight.defined(), affine);
        if (affine) {
          EXPECT_TRUE(all_close(on_cpu(gg.dweight), rg.dweight, sum_tol(dtype, rows), rtol(dtype)))
              << "layer_norm dweight " << what;
        }

        const auto rref = raw::rms_norm(x, w, 1e-6);
        const auto rgot = raw::rms_norm(on_gpu(x), maybe(w), 1e-6);
        EXPECT_TRUE(all_close(on_cpu(rgot.y), rref.y, atol(dtype), rtol(dtype))) << "rms_norm y " << what;
        EXPECT_TRUE(all_close(on_cpu(rgot.rstd), rref.rstd, 1e-5, 1e-5)) << "rms_norm rstd " << what;
        const auto rrg = raw::rms_norm_backward(g, x, w, rref.rstd);
        const auto rgg = raw::rms_norm_backward(on_gpu(g), on_gpu(x), maybe(w), on_gpu(rref.rstd));
        EXPECT_TRUE(all_close(on_cpu(rgg.dx), rrg.dx, atol(dtype) * 10, rtol(dtype) * 10)) << "rms_norm dx " << what;
        EXPECT_FALSE(rgg.dbias.defined());
        if (affine) {
          EXPECT_TRUE(all_close(on_cpu(rgg.dweight), rrg.dweight, sum_tol(dtype, rows), rtol(dtype)))
              << "rms_norm dweight " << what;
        }
      }
    }
  }
}

TEST_F(CudaNnTest, NormTakesStridedInputsAndIsDeterministic) {
  // A transposed view is made contiguous first; 3000 rows split the parameter sums into chunks.
  Tensor x = random_cpu({64, 3000}, DType::f32, 45);
  Tensor xt = raw::transpose(x, 0, 1);  // (3000, 64), strided
  Tensor w = random_cpu({64}, DType::f32, 46);
  Tensor b = random_cpu({64}, DType::f32, 47);
  const auto ref = raw::layer_norm(xt, w, b);
  const auto got = raw::layer_norm(raw::transpose(on_gpu(x), 0, 1), on_gpu(w), on_gpu(b));
  EXPECT_TRUE(all_close(on_cpu(got.y), ref.y, 1e-5, 1e-5));
  Tensor g = random_cpu({3000, 64}, DType::f32, 48);
  const auto a1 = raw::layer_norm_backward(on_gpu(g), got.y, on_gpu(w), got.mean, got.rstd);
  const auto a2 = raw::layer_norm_backward(on_gpu(g), got.y, on_gpu(w), got.mean, got.rstd);
  EXPECT_TRUE(all_close(on_cpu(a1.dweight), on_cpu(a2.dweight), 0, 0));
  EXPECT_TRUE(all_close(on_cpu(a1.dbias), on_cpu(a2.dbias), 0, 0));
  const auto r = raw::layer_norm_backward(g, on_cpu(got.y), w, on_cpu(got.mean), on_cpu(got.rstd));
  EXPECT_TRUE(all_close(on_cpu(a1.dweight), r.dweight, sum_tol(DType::f32, 3000), 1e-5));
}

TEST_F(CudaNnTest, CrossEntropyMatchesTheCpu) {
  // (64, 100): a warp per row; (8, 5000): a block per row with vector loads; (4, 3001): a block per row
  // with scalar loads (odd length).
  for (const Shape& shape : {Shape{64, 100}, Shape{8, 5000}, Shape{4, 3001}}) {
    for (DType dtype : {DType::f32, DType::f64, DType::bf16}) {
      for (DType tdtype : {DType::i32, DType::i64}) {
        const std::string what = dtype_name(dtype) + " " + shape_str(shape) + " targets " + dtype_name(tdtype);
        const int64_t rows = shape[0], classes = shape[1];
        Tensor logits = random_cpu(shape, dtype, 51, -6, 6);
        std::vector<int64_t> t(static_cast<size_t>(rows));
        for (int64_t r = 0; r < rows; ++r) t[r] = r % 5 == 2 ? -100 : (r * 37 + 11) % classes;  // some ignored
        Tensor targets = raw::to(from_vector(t, {rows}), tdtype);
        const auto ref = raw::cross_entropy(logits, targets);
        const auto got = raw::cross_entropy(on_gpu(logits), on_gpu(targets));
        // On the device the count stays there (valid_count -1): nothing is read back.
        EXPECT_EQ(got.valid_count, -1);
        EXPECT_EQ(got.count.item<int64_t>(), ref.valid_count) << what;
        EXPECT_EQ(got.loss.device(), Device::cuda(0));
        const double tol = dtype == DType::f64 ? 1e-12 : 1e-5;
        EXPECT_TRUE(all_close(on_cpu(got.lse), ref.lse, tol, tol)) << "lse " << what;
        EXPECT_TRUE(all_close(on_cpu(got.loss), ref.loss, tol, tol)) << "loss " << what;
        Tensor gl = scalar_tensor(0.7, {.dtype = dtype});
        Tensor rd = raw::cross_entropy_backward(gl, logits, targets, ref.lse, ref.valid_count);
        Tensor gd =
            raw::cross_entropy_backward(on_gpu(gl), on_gpu(logits), on_gpu(targets), on_gpu(ref.lse), ref.valid_count);
        EXPECT_EQ(gd.dtype(), dtype);
        EXPECT_LT(rel_error(on_cpu(gd), rd), dtype == DType::bf16 ? 1e-2 : tol) << "backward " << what;
        // The overload with the count tensor (what the autograd op uses): scale formed on the device.
        Tensor gc =
            raw::cross_entropy_backward(on_gpu(gl), on_gpu(logits), on_gpu(targets), on_gpu(ref.lse), got.count);
        EXPECT_LT(rel_error(on_cpu(gc), rd), dtype == DType::bf16 ? 1e-2 : tol) << "backward (count tensor) " << what;
        // Ignored rows get exactly 0.
        EXPECT_TRUE(all_close(on_cpu(raw::select(gd, 0, 2)), zeros({classes}, {.dtype = dtype}), 0, 0));
      }
    }
  }
}

TEST_F(CudaNnTest, CrossEntropyEdgeCasesAndErrors) {
  const float inf = INFINITY;
  // Row 0 fully masked (lse -inf, ignored), row 1 partly masked.
  Tensor logits = from_vector<float>({-inf, -inf, -inf, 1, -inf, 2}, {2, 3});
  Tensor targets = from_vector<int64_t>({-100, 2}, {2});
  const auto ref = raw::cross_entropy(logits, targets);
  const auto got = raw::cross_entropy(on_gpu(logits), on_gpu(targets));
  EXPECT_TRUE(all_close(on_cpu(got.lse), ref.lse, 1e-6, 1e-6));
  EXPECT_TRUE(all_close(on_cpu(got.loss), ref.loss, 1e-6, 1e-6));
  // The same cases in rows long enough for the one-pass block kernel (2000 columns): a fully masked
  // row, a row with one NaN, a row whose first half is masked (the running max starts at -inf).
  {
    std::vector<float> v(3 * 2000);
    for (int64_t j = 0; j < 2000; ++j) {
      v[j] = -inf;
      v[2000 + j] = static_cast<float>(j % 7) - 3.0f;
      v[4000 + j] = j < 1000 ? -inf : static_cast<float>(j % 11) * 0.5f;
    }
    v[2000 + 1234] = NAN;
    Tensor long_logits = from_vector<float>(v, {3, 2000});
    Tensor long_targets = from_vector<int64_t>({-100, 5, 1500}, {3});
    const auto lr = raw::cross_entropy(long_logits, long_targets);
    const auto lg = raw::cross_entropy(on_gpu(long_logits), on_gpu(long_targets));
    const std::vector<float> lse = on_cpu(lg.lse).to_vector<float>();
    const std::vector<float> lse_ref = lr.lse.to_vector<float>();
    EXPECT_EQ(lse[0], -inf);
    EXPECT_TRUE(std::isnan(lse[1])) << lse[1];
    EXPECT_NEAR(lse[2], lse_ref[2], 1e-5 * std::abs(lse_ref[2]));
    EXPECT_TRUE(std::isnan(lg.loss.item<float>()));  // the NaN row is not ignored
  }
  // Every target ignored: loss 0 and a zero gradient.
  Tensor none = from_vector<int64_t>({-100, -100}, {2});
  const auto z = raw::cross_entropy(on_gpu(logits), on_gpu(none));
  EXPECT_EQ(z.count.item<int64_t>(), 0);
  EXPECT_EQ(z.loss.item<double>(), 0.0);
  EXPECT_TRUE(all_close(on_cpu(raw::cross_entropy_backward(scalar_tensor(1.0), on_gpu(logits), on_gpu(none), z.lse, 0)),
                        zeros({2, 3}), 0, 0));
  const Tensor zc = raw::cross_entropy_backward(scalar_tensor(1.0), on_gpu(logits), on_gpu(none), z.lse, z.count);
  EXPECT_TRUE(all_close(on_cpu(zc), zeros({2, 3}), 0, 0));
  // Errors: a target out of range (checked on the device, raised with the CPU's message at the next
  // synchronisation), a count that does not match, lse on another device.
  Tensor x = on_gpu(random_cpu({2, 5}, DType::f32, 52));
  EXPECT_CPF_ERROR(raw::cross_entropy(x, on_gpu(from_vector<int64_t>({1, 7}, {2}))).loss.item<float>(),
                   "cross_entropy: target 7 at row 1 is out of range for C=5 classes");
  Tensor tg = on_gpu(from_vector<int64_t>({1, 3}, {2}));
  const auto ok = raw::cross_entropy(x, tg);
  EXPECT_CPF_ERROR(raw::cross_entropy_backward(scalar_tensor(1.0), x, tg, ok.lse, 1),
                   "cross_entropy_backward: valid_count 1 does not match the 2 targets");
  EXPECT_CPF_ERROR(raw::cross_entropy_backward(scalar_tensor(1.0), x, tg, on_cpu(ok.lse), 2),
                   "cross_entropy_backward: tensors are on different devices: cuda:0 vs cpu");
  EXPECT_CPF_ERROR(raw::cross_entropy_backward(scalar_tensor(1.0), x, tg, ok.lse, on_gpu(scalar_tensor(2.0))),
                   "cross_entropy_backward: count must be a one-element i64 tensor");
  EXPECT_CPF_ERROR(raw::cross_entropy_backward(scalar_tensor(1.0), x, tg, ok.lse, Tensor()),
                   "cross_entropy_backward: argument 'count' is an undefined tensor");
}

TEST_F(CudaNnTest, RopeMatchesTheCpu) {
  for (DType dtype : {DType::f32, DType::f64, DType::bf16}) {
    const double tol = dtype == DType::f64 ? 1e-12 : 1e-5;
    const double rt = dtype == DType::bf16 ? 1.0 / 128 : tol;
    Tensor x = random_cpu({2, 5, 3, 16}, dtype, 61);
    Tensor pos_t = from_vector<int64_t>({0, 1, 2, 7, 1000}, {5});
    Tensor pos_bt = raw::to(from_vector<int64_t>({3, 4, 5, 6, 7, -2, 0, 9, 100, 12345}, {2, 5}), DType::i32);
    for (int64_t rot : {-1, 8}) {
      for (bool inverse : {false, true}) {
        const std::string what = dtype_name(dtype) + " rot " + std::to_string(rot) + (inverse ? " inverse" : "");
        EXPECT_TRUE(all_close(on_cpu(raw::rope(on_gpu(x), on_gpu(pos_t), 10000.0, rot, inverse)),
                              raw::rope(x, pos_t, 10000.0, rot, inverse), tol, rt))
            << "(T) positions " << what;
        EXPECT_TRUE(all_close(on_cpu(raw::rope(on_gpu(x), on_gpu(pos_bt), 500.0, rot, inverse)),
                              raw::rope(x, pos_bt, 500.0, rot, inverse), tol, rt))
            << "(B, T) positions " << what;
        EXPECT_TRUE(all_close(on_cpu(raw::rope_backward(on_gpu(x), on_gpu(pos_t), 10000.0, rot, inverse)),
                              raw::rope_backward(x, pos_t, 10000.0, rot, inverse), tol, rt))
            << "backward " << what;
      }
    }
    // Llama 3's scaled frequencies (rope_frequencies.h), computed by the same function on both sides.
    const RopeFrequencies llama3{
        .base = 20000.0,
        .scaling = {.factor = 8, .low_freq_factor = 0.5, .high_freq_factor = 8, .original_context = 64}};
    EXPECT_TRUE(all_close(on_cpu(raw::rope(on_gpu(x), on_gpu(pos_t), llama3)), raw::rope(x, pos_t, llama3), tol, rt))
        << "llama3 scaling " << dtype_name(dtype);
    // thd layout, and a strided (B, T, H, D) view of a (B, H, T, D) tensor (unit stride along D).
    Tensor xthd = random_cpu({5, 3, 16}, dtype, 62);
    EXPECT_TRUE(all_close(on_cpu(raw::rope(on_gpu(xthd), on_gpu(pos_t))), raw::rope(xthd, pos_t), tol, rt));
    Tensor bhtd = random_cpu({2, 3, 5, 16}, dtype, 63);
    EXPECT_TRUE(all_close(on_cpu(raw::rope(raw::transpose(on_gpu(bhtd), 1, 2), on_gpu(pos_t))),
                          raw::rope(raw::transpose(bhtd, 1, 2), pos_t), tol, rt));
  }
}

}  // namespace
}  // namespace cpf
