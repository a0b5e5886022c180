// The fused residual add + norm on the CPU (framework/tensor/ops/add_norm.h): it must be exactly the
// unfused ops the GPT ran before (an f32 add of the widened branch, the f32 norm, one rounding of y), so
// CPU results of the models do not move; its backward exactly the sum of the unfused gradients; every
// rejected input names its values.
#include "framework/tensor/ops/add_norm.h"

#include <gtest/gtest.h>

#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/norm.h"
#include "framework/tensor/ops/views.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

using raw::NormKind;
using testing::random_tensor;

::testing::AssertionResult equal(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype()) return ::testing::AssertionFailure() << a.dtype() << " vs " << b.dtype();
  return testing::all_close(a, b, 0.0, 0.0);
}

struct Case {
  NormKind kind;
  DType branch, out;
  bool weight, bias;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (NormKind kind : {NormKind::layer_norm, NormKind::rms_norm}) {
    for (DType branch : {DType::f32, DType::bf16}) {
      for (DType y : {DType::f32, DType::bf16}) {
        for (bool w : {true, false}) {
          out.push_back({kind, branch, y, w, kind == NormKind::layer_norm && w});
          if (kind == NormKind::layer_norm && !w) out.push_back({kind, branch, y, false, true});
        }
      }
    }
  }
  return out;
}

// The unfused forward: add of the widened branch, the norm in x's dtype, y rounded once.
raw::AddNormResult unfused(const Case& c, const Tensor& x, const Tensor& b, const Tensor& w, const Tensor& bias) {
  const Tensor x1 = raw::add(x, raw::to(b, x.dtype()));
  if (c.kind == NormKind::layer_norm) {
    raw::LayerNormResult r = raw::layer_norm(x1, w, bias, 1e-5);
    return {x1, raw::to(r.y, c.out), r.mean, r.rstd};
  }
  raw::RmsNormResult r = raw::rms_norm(x1, w, 1e-5);
  return {x1, raw::to(r.y, c.out), Tensor(), r.rstd};
}

TEST(AddNorm, IsExactlyTheUnfusedOps) {
  const Tensor x = random_tensor({3, 4, 33}, DType::f32, 1, -3, 3);
  for (const Case& c : cases()) {
    const std::string what = std::string(c.kind == NormKind::layer_norm ? "layer" : "rms") + " branch " +
                             dtype_name(c.branch) + " out " + dtype_name(c.out) + (c.weight ? " w" : "") +
                             (c.bias ? " b" : "");
    const Tensor b = raw::to(random_tensor({3, 4, 33}, DType::f32, 2, -1, 1), c.branch);
    const Tensor w = c.weight ? random_tensor({33}, DType::f32, 3, 0.5, 1.5) : Tensor();
    const Tensor bias = c.bias ? random_tensor({33}, DType::f32, 4) : Tensor();
    const raw::AddNormResult got = raw::add_norm(c.kind, x, b, w, bias, 1e-5, c.out);
    const raw::AddNormResult ref = unfused(c, x, b, w, bias);
    EXPECT_TRUE(equal(got.x1, ref.x1)) << what;
    EXPECT_TRUE(equal(got.y, ref.y)) << what;
    EXPECT_EQ(got.y.dtype(), c.out) << what;
    EXPECT_TRUE(equal(got.rstd, ref.rstd)) << what;
    if (c.kind == NormKind::layer_norm) EXPECT_TRUE(equal(got.mean, ref.mean)) << what;
    if (c.kind == NormKind::rms_norm) EXPECT_FALSE(got.mean.defined()) << what;

    // Backward: dx = grad_x1 + the norm's dx of the widened grad_y; dbranch = dx in the branch's dtype.
    const Tensor gx1 = random_tensor({3, 4, 33}, DType::f32, 5);
    const Tensor gy = raw::to(random_tensor({3, 4, 33}, DType::f32, 6), c.out);
    const std::optional<DType> bd = c.branch;
    const raw::AddNormGrads d =
        raw::add_norm_backward(c.kind, gx1, gy, c.out, got.x1, w, c.bias, got.mean, got.rstd, bd);
    const Tensor g32 = raw::to(gy, DType::f32);
    const raw::NormGrads n = c.kind == NormKind::layer_norm
                                 ? raw::layer_norm_backward(g32, ref.x1, w, ref.mean, ref.rstd)
                                 : raw::rms_norm_backward(g32, ref.x1, w, ref.rstd);
    const Tensor dx = raw::add(gx1, n.dx);
    EXPECT_TRUE(equal(d.dx, dx)) << what;
    EXPECT_TRUE(equal(d.dbranch, raw::to(dx, c.branch))) << what;
    EXPECT_EQ(d.dweight.defined(), c.weight) << what;
    if (c.weight) EXPECT_TRUE(equal(d.dweight, n.dweight)) << what;
    EXPECT_EQ(d.dbias.defined(), c.bias) << what;
    if (c.bias) EXPECT_TRUE(equal(d.dbias, n.dbias)) << what;
  }
}

TEST(AddNorm, WithoutBranchIsThePlainNormInTheOutputDtype) {
  const Tensor x = random_tensor({5, 16}, DType::f32, 7, -2, 2);
  const Tensor w = random_tensor({16}, DType::f32, 8, 0.5, 1.5);
  const raw::AddNormResult r = raw::add_norm(NormKind::rms_norm, x, Tensor(), w, Tensor(), 1e-6, DType::bf16);
  EXPECT_TRUE(r.x1.is_same(x));
  EXPECT_TRUE(equal(r.y, raw::to(raw::rms_norm(x, w, 1e-6).y, DType::bf16)));
  // Backward without grad_x1 and without a branch: the norm's gradients alone.
  const Tensor gy = raw::to(random_tensor({5, 16}, DType::f32, 9), DType::bf16);
  const raw::AddNormGrads d =
      raw::add_norm_backward(NormKind::rms_norm, Tensor(), gy, DType::bf16, x, w, false, Tensor(), r.rstd, {});
  const raw::NormGrads n = raw::rms_norm_backward(raw::to(gy, DType::f32), x, w, r.rstd);
  EXPECT_TRUE(equal(d.dx, n.dx));
  EXPECT_TRUE(equal(d.dweight, n.dweight));
  EXPECT_FALSE(d.dbranch.defined());
  // Without grad_y (an unused y): dx is grad_x1 and the parameter gradients are zero.
  const Tensor gx1 = random_tensor({5, 16}, DType::f32, 10);
  const raw::AddNormGrads z =
      raw::add_norm_backward(NormKind::rms_norm, gx1, Tensor(), DType::bf16, x, w, false, Tensor(), r.rstd, {});
  EXPECT_TRUE(equal(z.dx, gx1));
  EXPECT_TRUE(equal(z.dweight, zeros({16})));
}

TEST(AddNorm, F64AndStridedInputs) {
  const Tensor xt = random_tensor({7, 5}, DType::f64, 11, -2, 2);
  const Tensor x = raw::transpose(xt, 0, 1);  // (5, 7) strided
  const Tensor b = raw::transpose(random_tensor({7, 5}, DType::f64, 12), 0, 1);
  const Tensor w = random_tensor({7}, DType::f64, 13, 0.5, 1.5);
  const raw::AddNormResult r = raw::add_norm(NormKind::layer_norm, x, b, w, w, 1e-5, DType::f64);
  const raw::LayerNormResult n = raw::layer_norm(raw::add(x, b), w, w, 1e-5);
  EXPECT_TRUE(equal(r.y, n.y));
  EXPECT_TRUE(equal(r.x1, raw::add(x, b)));
}

TEST(AddNorm, RejectsBadInputs) {
  const Tensor x = random_tensor({2, 4}, DType::f32, 1);
  const Tensor w = ones({4});
  const auto L = NormKind::layer_norm, R = NormKind::rms_norm;
  EXPECT_CPF_ERROR(raw::add_norm(L, Tensor(), Tensor(), w, Tensor(), 1e-5, DType::f32),
                   "add_layer_norm: argument 'x' is an undefined tensor");
  EXPECT_CPF_ERROR(
      raw::add_norm(L, ones({2, 4}, {.dtype = DType::i64}), Tensor(), Tensor(), Tensor(), 1e-5, DType::i64),
      "add_layer_norm: x must be a floating tensor (f32, f64 or bf16), got i64");
  EXPECT_CPF_ERROR(raw::add_norm(R, ones({2, 0}), Tensor(), Tensor(), Tensor(), 1e-5, DType::f32),
                   "add_rms_norm: the normalised (last) dim of x is empty, shape [2,0]");
  EXPECT_CPF_ERROR(raw::add_norm(L, x, ones({2, 5}), w, Tensor(), 1e-5, DType::f32),
                   "add_layer_norm: branch of shape [2,5] does not match x of shape [2,4]");
  EXPECT_CPF_ERROR(raw::add_norm(L, x, ones({2, 4}, {.dtype = DType::f64}), w, Tensor(), 1e-5, DType::f32),
                   "add_layer_norm: branch is f64 but x is f32 (it must be x's dtype, or bf16 with an f32 x)");
  EXPECT_CPF_ERROR(raw::add_norm(L, raw::to(x, DType::f64), Tensor(), Tensor(), Tensor(), 1e-5, DType::bf16),
                   "add_layer_norm: the output dtype is bf16 but x is f64");
  EXPECT_CPF_ERROR(raw::add_norm(L, x, Tensor(), ones({3}), Tensor(), 1e-5, DType::f32),
                   "add_layer_norm: weight must have shape [4] (the last dim of x [2,4]), got [3]");
  EXPECT_CPF_ERROR(raw::add_norm(L, x, Tensor(), ones({4}, {.dtype = DType::bf16}), Tensor(), 1e-5, DType::bf16),
                   "add_layer_norm: weight is bf16 but x is f32 (the norm's parameters stay in the residual");
  EXPECT_CPF_ERROR(raw::add_norm(R, x, Tensor(), w, ones({4}), 1e-5, DType::f32),
                   "add_rms_norm: RMSNorm has no bias, got one of shape [4]");
  EXPECT_CPF_ERROR(raw::add_norm(R, x, Tensor(), w, Tensor(), -1.0, DType::f32),
                   "add_rms_norm: eps must be finite and >= 0, got -1");
}

TEST(AddNorm, BackwardRejectsBadInputs) {
  const Tensor x1 = random_tensor({2, 4}, DType::f32, 1);
  const Tensor w = ones({4});
  const raw::AddNormResult r = raw::add_norm(NormKind::layer_norm, x1, Tensor(), w, Tensor(), 1e-5, DType::f32);
  const auto L = NormKind::layer_norm;
  const Tensor g = ones({2, 4});
  EXPECT_CPF_ERROR(raw::add_norm_backward(L, ones({2, 3}), g, DType::f32, x1, w, false, r.mean, r.rstd, {}),
                   "add_layer_norm_backward: grad_x1 of shape [2,3] does not match x1 of shape [2,4]");
  EXPECT_CPF_ERROR(raw::add_norm_backward(L, Tensor(), g, DType::bf16, x1, w, false, r.mean, r.rstd, {}),
                   "add_layer_norm_backward: grad_y is f32 but the output y was bf16");
  EXPECT_CPF_ERROR(raw::add_norm_backward(L, raw::to(g, DType::bf16), g, DType::f32, x1, w, false, r.mean, r.rstd, {}),
                   "add_layer_norm_backward: grad_x1 is bf16 but x1 is f32");
  EXPECT_CPF_ERROR(raw::add_norm_backward(L, Tensor(), g, DType::f32, x1, w, false, Tensor(), r.rstd, {}),
                   "add_layer_norm_backward: argument 'mean' is an undefined tensor");
  EXPECT_CPF_ERROR(raw::add_norm_backward(L, Tensor(), g, DType::f32, x1, w, false, r.mean, ones({3}), {}),
                   "add_layer_norm_backward: rstd must have shape [2] (x1 is [2,4]), got [3]");
  EXPECT_CPF_ERROR(raw::add_norm_backward(L, Tensor(), g, DType::f32, x1, w, false, r.mean, r.rstd, DType::f64),
                   "add_layer_norm_backward: the branch dtype is f64 but x is f32");
  EXPECT_CPF_ERROR(
      raw::add_norm_backward(NormKind::rms_norm, Tensor(), g, DType::f32, x1, w, true, Tensor(), r.rstd, {}),
      "add_rms_norm_backward: RMSNorm has no bias");
}

}  // namespace
}  // namespace cpf
