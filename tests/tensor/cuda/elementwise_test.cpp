// Element-wise kernels on the GPU against the CPU kernels: every op and dtype, broadcasting, strided
// (transposed, sliced) inputs, in-place ops. Tolerances: cuda_test_utils.h (rtol_for / atol_for).
#include "framework/tensor/ops/elementwise.h"
#include "cuda_test_utils.h"
#include "framework/tensor/ops/views.h"

namespace cpf {
namespace {

using raw::BinaryOp;
using raw::CompareOp;
using raw::UnaryOp;
using testing::all_close;
using testing::atol_for;
using testing::on_cpu;
using testing::on_gpu;
using testing::random_cpu;
using testing::rtol_for;

class CudaElementwiseTest : public testing::CudaTest {};

const std::vector<UnaryOp> kUnaryOps{
    UnaryOp::neg,  UnaryOp::exp,  UnaryOp::log,     UnaryOp::sqrt, UnaryOp::rsqrt,  UnaryOp::tanh,      UnaryOp::gelu,
    UnaryOp::silu, UnaryOp::relu, UnaryOp::sigmoid, UnaryOp::abs,  UnaryOp::square, UnaryOp::reciprocal};
const std::vector<DType> kFloating{DType::f32, DType::f64, DType::bf16};

// log/sqrt/rsqrt/reciprocal get positive inputs, the others [-4, 4).
Tensor unary_input(UnaryOp op, const Shape& shape, DType dtype, uint64_t seed) {
  const bool positive = op == UnaryOp::log || op == UnaryOp::sqrt || op == UnaryOp::rsqrt || op == UnaryOp::reciprocal;
  return random_cpu(shape, dtype, seed, positive ? 0.1 : -4.0, 4.0);
}

TEST_F(CudaElementwiseTest, UnaryOpsMatchTheCpu) {
  for (DType dtype : kFloating) {
    for (UnaryOp op : kUnaryOps) {
      // Large enough for the vectorised path (and its tail), plus a transposed view (strided path).
      Tensor x = unary_input(op, {37, 1031}, dtype, 1 + static_cast<uint64_t>(op));
      EXPECT_TRUE(all_close(on_cpu(raw::unary(op, on_gpu(x))), raw::unary(op, x), atol_for(dtype), rtol_for(dtype)))
          << raw::op_name(op) << " " << dtype_name(dtype);
      Tensor xt = raw::transpose(x, 0, 1);
      Tensor gt = raw::transpose(on_gpu(x), 0, 1);
      EXPECT_TRUE(all_close(on_cpu(raw::unary(op, gt)), raw::unary(op, xt), atol_for(dtype), rtol_for(dtype)))
          << raw::op_name(op) << " " << dtype_name(dtype) << " transposed";
    }
  }
  for (DType dtype : {DType::i32, DType::i64}) {
    for (UnaryOp op : {UnaryOp::neg, UnaryOp::abs, UnaryOp::square}) {
      Tensor x = random_cpu({1000}, dtype, 3, -1000, 1000);
      EXPECT_TRUE(all_close(on_cpu(raw::unary(op, on_gpu(x))), raw::unary(op, x), 0, 0)) << raw::op_name(op);
    }
  }
}

TEST_F(CudaElementwiseTest, UnaryBackwardMatchesTheCpu) {
  for (DType dtype : kFloating) {
    for (UnaryOp op : kUnaryOps) {
      Tensor x = unary_input(op, {513}, dtype, 20 + static_cast<uint64_t>(op));
      Tensor y = raw::unary(op, x);
      Tensor g = random_cpu({513}, dtype, 40 + static_cast<uint64_t>(op));
      Tensor expected = raw::unary_backward(op, g, x, y);
      Tensor got = raw::unary_backward(op, on_gpu(g), on_gpu(x), on_gpu(y));
      EXPECT_TRUE(all_close(on_cpu(got), expected, atol_for(dtype), rtol_for(dtype)))
          << raw::op_name(op) << " " << dtype_name(dtype);
    }
  }
}

TEST_F(CudaElementwiseTest, BinaryOpsBroadcastAndFollowStrides) {
  const std::vector<BinaryOp> ops{BinaryOp::add, BinaryOp::sub,     BinaryOp::mul,    BinaryOp::div,
                                  BinaryOp::pow, BinaryOp::maximum, BinaryOp::minimum};
  // (shape a, shape b): same shape, row broadcast, column broadcast, both broadcast, scalar.
  const std::vector<std::pair<Shape, Shape>> shapes{
      {{64, 129}, {64, 129}},
      {{64, 129}, {129}},
      {{64, 129}, {64, 1}},
      {{8, 1, 33}, {1, 17, 33}},
      {{300}, {}},
      // Innermost sizes a multiple of the vector width: the vectorised strided kernel.
      {{64, 256}, {256}},
      {{64, 256}, {64, 1}},
      {{8, 1, 64}, {1, 16, 64}}};
  for (DType dtype : kFloating) {
    for (BinaryOp op : ops) {
      for (const auto& [sa, sb] : shapes) {
        const bool positive = op == BinaryOp::pow;
        Tensor a = random_cpu(sa, dtype, 5, positive ? 0.5 : -2.0, 2.0);
        Tensor b = random_cpu(sb, dtype, 6, positive ? -2.0 : 0.25, 2.0);
        Tensor expected = raw::binary(op, a, b);
        Tensor got = raw::binary(op, on_gpu(a), on_gpu(b));
        EXPECT_TRUE(all_close(on_cpu(got), expected, atol_for(dtype), rtol_for(dtype)))
            << raw::op_name(op) << " " << dtype_name(dtype) << " " << shape_str(sa) << " " << shape_str(sb);
      }
      // Transposed operands.
      Tensor a = random_cpu({40, 70}, dtype, 7, 0.5, 2.0);
      Tensor b = random_cpu({70, 40}, dtype, 8, 0.5, 2.0);
      Tensor expected = raw::binary(op, a, raw::transpose(b, 0, 1));
      Tensor got = raw::binary(op, on_gpu(a), raw::transpose(on_gpu(b), 0, 1));
      EXPECT_TRUE(all_close(on_cpu(got), expected, atol_for(dtype), rtol_for(dtype))) << raw::op_name(op) << " strided";
    }
  }
  // A scalar operand (binary(op, a, double)).
  Tensor a = random_cpu({1000}, DType::f32, 9);
  EXPECT_TRUE(all_close(on_cpu(raw::mul(on_gpu(a), 0.1)), raw::mul(a, 0.1), 0, 0));
}

TEST_F(CudaElementwiseTest, IntegerArithmeticWrapsAndTruncatesLikeTheCpu) {
  for (DType dtype : {DType::i32, DType::i64}) {
    Tensor a = random_cpu({2000}, dtype, 10, -100000, 100000);
    Tensor b = random_cpu({2000}, dtype, 11, 1, 50);
    for (BinaryOp op :
         {BinaryOp::add, BinaryOp::sub, BinaryOp::mul, BinaryOp::div, BinaryOp::maximum, BinaryOp::minimum}) {
      EXPECT_TRUE(all_close(on_cpu(raw::binary(op, on_gpu(a), on_gpu(b))), raw::binary(op, a, b), 0, 0))
          << raw::op_name(op) << " " << dtype_name(dtype);
    }
  }
  // Overflow wraps; INT_MIN / -1 wraps to INT_MIN.
  Tensor big = from_vector<int32_t>({2147483647, -2147483647 - 1, 7}, {3});
  Tensor other = from_vector<int32_t>({1, -1, -2}, {3});
  EXPECT_TRUE(all_close(on_cpu(raw::add(on_gpu(big), on_gpu(other))), raw::add(big, other), 0, 0));
  EXPECT_TRUE(all_close(on_cpu(raw::div(on_gpu(big), on_gpu(other))), raw::div(big, other), 0, 0));
}

TEST_F(CudaElementwiseTest, ComparisonsAndWhere) {
  const std::vector<CompareOp> ops{CompareOp::eq, CompareOp::ne, CompareOp::lt,
                                   CompareOp::le, CompareOp::gt, CompareOp::ge};
  for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::i32, DType::i64}) {
    // Few distinct values so that equality happens.
    Tensor a = raw::to(raw::to(random_cpu({50, 60}, DType::f64, 12, -3, 3), DType::i32), dtype);
    Tensor b = raw::to(raw::to(random_cpu({60}, DType::f64, 13, -3, 3), DType::i32), dtype);
    for (CompareOp op : ops) {
      EXPECT_TRUE(all_close(on_cpu(raw::compare(op, on_gpu(a), on_gpu(b))), raw::compare(op, a, b), 0, 0))
          << static_cast<int>(op) << " " << dtype_name(dtype);
    }
    Tensor cond = raw::compare(CompareOp::gt, a, b);
    Tensor c = random_cpu({50, 1}, dtype, 14, -5, 5);
    EXPECT_TRUE(all_close(on_cpu(raw::where(on_gpu(cond), on_gpu(a), on_gpu(c))), raw::where(cond, a, c), 0, 0))
        << "where " << dtype_name(dtype);
  }
  Tensor p = from_vector<bool>({true, false, true, false}, {4});
  Tensor q = from_vector<bool>({true, true, false, false}, {4});
  EXPECT_TRUE(
      all_close(on_cpu(raw::compare(CompareOp::ne, on_gpu(p), on_gpu(q))), raw::compare(CompareOp::ne, p, q), 0, 0));
  EXPECT_TRUE(all_close(on_cpu(raw::where(on_gpu(p), on_gpu(q), on_gpu(p))), raw::where(p, q, p), 0, 0));
  // NaN compares unequal and propagates through maximum.
  Tensor n = from_vector<float>({NAN, 1.0f}, {2});
  Tensor m = from_vector<float>({0.0f, NAN}, {2});
  EXPECT_TRUE(all_close(on_cpu(raw::binary(BinaryOp::maximum, on_gpu(n), on_gpu(m))),
                        raw::binary(BinaryOp::maximum, n, m), 0, 0));
  EXPECT_TRUE(
      all_close(on_cpu(raw::compare(CompareOp::eq, on_gpu(n), on_gpu(n))), raw::compare(CompareOp::eq, n, n), 0, 0));
}

TEST_F(CudaElementwiseTest, InPlaceAddAndMulRoundLikeTheCpu) {
  for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::i32, DType::i64}) {
    const double alpha = is_floating(dtype) ? 0.3 : 3.0;
    Tensor d = random_cpu({33, 64}, dtype, 15, -50, 50);
    Tensor s = random_cpu({64}, dtype, 16, -50, 50);  // broadcast over rows
    Tensor gd = on_gpu(d);
    const uint64_t version = gd.version();
    raw::add_(gd, on_gpu(s), alpha);
    raw::add_(d, s, alpha);
    EXPECT_GT(gd.version(), version);
    EXPECT_TRUE(all_close(on_cpu(gd), d, 0, 0)) << "add_ " << dtype_name(dtype);
    raw::mul_(gd, 0.7);
    raw::mul_(d, 0.7);
    EXPECT_TRUE(all_close(on_cpu(gd), d, 0, 0)) << "mul_ " << dtype_name(dtype);
    // Through a strided view: only the view changes.
    Tensor col = raw::select(gd, 1, 3);
    raw::mul_(col, -2.0);
    raw::mul_(raw::select(d, 1, 3), -2.0);
    EXPECT_TRUE(all_close(on_cpu(gd), d, 0, 0)) << "mul_ strided " << dtype_name(dtype);
  }
}

TEST_F(CudaElementwiseTest, EmptyTensorsAndZeroDimTensors) {
  Tensor e = empty({0, 5}, {.device = Device::cuda()});
  EXPECT_EQ(raw::exp(e).shape(), (Shape{0, 5}));
  EXPECT_EQ(raw::add(e, e).numel(), 0);
  Tensor s = scalar_tensor(2.0, {.device = Device::cuda()});
  EXPECT_EQ(raw::mul(s, s).item<float>(), 4.0f);
}

}  // namespace
}  // namespace cpf
