// Element-wise compare ops, where and the in-place ops (framework/tensor/ops/elementwise.h) against naive
// loops (elementwise_reference.h), with broadcasting, and the device checks every element-wise op makes.
#include "framework/tensor/ops/elementwise.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>

#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/matmul.h"
#include "framework/tensor/ops/reduce.h"
#include "framework/tensor/ops/views.h"
#include "support/host_as_device.h"
#include "support/test_utils.h"
#include "tests/tensor/elementwise_reference.h"

namespace cpf {
namespace {

using namespace testing;  // the references (elementwise_reference.h), all_close, random_tensor

// ---- compare and where ----

TEST(Compare, EveryOpWithBroadcasting) {
  for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::i32, DType::i64}) {
    Tensor a = raw::to(from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3}), dtype);
    Tensor b = raw::to(from_vector<double>({2, 2, 7}, {3}), dtype);
    for (CompareOp op : kCompareOps) {
      Tensor y = raw::compare(op, a, b);
      EXPECT_EQ(y.dtype(), DType::boolean);
      Shape shape;
      const auto expected = naive_binary(
          a, b, [op](double x, double z) { return double(ref_compare(op, x, z)); }, &shape);
      EXPECT_EQ(y.shape(), shape);
      EXPECT_EQ(y.to_vector<double>(), expected) << dtype_name(dtype) << " op " << static_cast<int>(op);
      // Scalar right-hand side.
      const auto vs = raw::compare(op, a, 3.0).to_vector<double>();
      const auto av = a.to_vector<double>();
      for (size_t i = 0; i < av.size(); ++i) EXPECT_EQ(vs[i], double(ref_compare(op, av[i], 3.0)));
    }
  }
  Tensor nan = from_vector<float>({NAN}, {1});
  EXPECT_FALSE(raw::compare(CompareOp::eq, nan, nan).item<bool>());
  EXPECT_TRUE(raw::compare(CompareOp::ne, nan, nan).item<bool>());
  Tensor bools = from_vector<bool>({true, false}, {2});
  EXPECT_EQ(raw::compare(CompareOp::eq, bools, from_vector<bool>({true, true}, {2})).to_vector<double>(),
            (std::vector<double>{1, 0}));
  EXPECT_CPF_ERROR(raw::compare(CompareOp::lt, zeros({2}), zeros({2}, {.dtype = DType::i32})),
                   "compare: dtypes differ: f32 [2] vs i32 [2]");
  EXPECT_CPF_ERROR(raw::compare(CompareOp::lt, zeros({2}), zeros({3})),
                   "compare: shapes [2] and [3] are not broadcastable");
  EXPECT_CPF_ERROR(raw::compare(CompareOp::lt, Tensor(), zeros({3})), "compare: argument 'a' is an undefined tensor");
}

TEST(Where, BroadcastsAllThree) {
  Tensor cond = from_vector<bool>({true, false, true}, {3});
  Tensor a = raw::reshape(arange(0.0, 6.0, 1.0, {.dtype = DType::f64}), {2, 3});
  Tensor b = full({2, 1}, -1.0, {.dtype = DType::f64});
  EXPECT_EQ(raw::where(cond, a, b).to_vector<double>(), (std::vector<double>{0, -1, 2, 3, -1, 5}));
  EXPECT_EQ(raw::where(raw::unsqueeze(cond, 1), scalar_tensor(1.0), zeros({3, 2})).to_vector<float>(),
            (std::vector<float>{1, 1, 0, 0, 1, 1}));
  EXPECT_EQ(raw::where(cond, from_vector<int64_t>({1, 2, 3}, {3}), from_vector<int64_t>({9}, {1})).to_vector<int64_t>(),
            (std::vector<int64_t>{1, 9, 3}));
  Tensor bf = raw::where(cond, ones({3}, {.dtype = DType::bf16}), zeros({3}, {.dtype = DType::bf16}));
  EXPECT_EQ(bf.dtype(), DType::bf16);
  EXPECT_EQ(bf.to_vector<float>(), (std::vector<float>{1, 0, 1}));
  EXPECT_CPF_ERROR(raw::where(zeros({3}), a, b), "where: condition must be bool, got f32");
  EXPECT_CPF_ERROR(raw::where(cond, a, zeros({2, 1})), "where: dtypes differ: f64 [2,3] vs f32 [2,1]");
  EXPECT_CPF_ERROR(raw::where(cond, a, zeros({4}, {.dtype = DType::f64})),
                   "where: shapes [2,3] and [4] are not broadcastable");
  EXPECT_CPF_ERROR(raw::where(Tensor(), a, b), "where: argument 'cond' is an undefined tensor");
}

// ---- in place ----

TEST(InPlace, AddAndMul) {
  Tensor dst = raw::reshape(arange(0.0, 6.0, 1.0, {.dtype = DType::f32}), {2, 3});
  const uint64_t v = dst.version();
  raw::add_(dst, from_vector<float>({1, 2, 3}, {3}), 2.0);
  EXPECT_EQ(dst.to_vector<float>(), (std::vector<float>{2, 5, 8, 5, 8, 11}));
  EXPECT_EQ(dst.version(), v + 1);
  raw::mul_(dst, 0.5);
  EXPECT_EQ(dst.to_vector<float>(), (std::vector<float>{1, 2.5, 4, 2.5, 4, 5.5}));
  EXPECT_EQ(dst.version(), v + 2);
  // Through a non-contiguous view: only the view's elements change.
  Tensor base = zeros({3, 4}, {.dtype = DType::f64});
  raw::add_(raw::transpose(raw::narrow(base, 1, 1, 2), 0, 1), ones({2, 3}, {.dtype = DType::f64}), -1.5);
  EXPECT_EQ(base.to_vector<double>(), (std::vector<double>{0, -1.5, -1.5, 0, 0, -1.5, -1.5, 0, 0, -1.5, -1.5, 0}));
  // Large, parallel.
  Tensor big = zeros({1 << 17}, {.dtype = DType::f64});
  raw::add_(big, full({}, 2.0, {.dtype = DType::f64}));
  raw::mul_(big, 3.0);
  EXPECT_EQ(big.to_vector<double>(), std::vector<double>(1 << 17, 6.0));
  // bf16 and integers.
  Tensor h = ones({2}, {.dtype = DType::bf16});
  raw::add_(h, full({2}, 0x1p-8, {.dtype = DType::bf16}), 1.0);  // 1 + 2^-8 rounds to even: 1
  EXPECT_EQ(h.to_vector<float>(), (std::vector<float>{1, 1}));
  raw::mul_(h, 3.0);
  EXPECT_EQ(h.to_vector<float>(), (std::vector<float>{3, 3}));
  Tensor i = from_vector<int64_t>({1, 2}, {2});
  raw::add_(i, from_vector<int64_t>({10, 20}, {2}), -2.0);
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{-19, -38}));
  raw::mul_(i, 2.0);
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{-38, -76}));
}

TEST(InPlace, Errors) {
  Tensor dst = zeros({3});
  EXPECT_CPF_ERROR(raw::add_(dst, zeros({2, 3})), "add_: source [2,3] does not broadcast to destination [3]");
  EXPECT_CPF_ERROR(raw::add_(dst, zeros({4})), "add_: shapes [3] and [4] are not broadcastable");
  EXPECT_CPF_ERROR(raw::add_(dst, zeros({3}, {.dtype = DType::f64})), "add_: dtypes differ: f32 [3] vs f64 [3]");
  Tensor b = from_vector<bool>({true}, {1});
  EXPECT_CPF_ERROR(raw::add_(b, b), "add_: not defined for bool tensors");
  EXPECT_CPF_ERROR(raw::mul_(b, 2.0), "mul_: not defined for bool tensors");
  EXPECT_CPF_ERROR(raw::add_(zeros({2}, {.dtype = DType::i32}), zeros({2}, {.dtype = DType::i32}), 0.5),
                   "add_: alpha=0.5 must be a whole number for a i32 tensor");
  EXPECT_CPF_ERROR(raw::add_(Tensor(), dst), "add_: argument 'dst' is an undefined tensor");
  EXPECT_CPF_ERROR(raw::mul_(Tensor(), 1.0), "mul_: argument 'dst' is an undefined tensor");
}

// ---- devices ----

using FakeDeviceBackend = testing::HostAsDevice;  // tests/support/host_as_device.h

class DeviceChecks : public ::testing::Test {
 protected:
  void SetUp() override {
    if (has_device_backend(DeviceType::cuda)) GTEST_SKIP() << "a real CUDA backend is registered";
    register_device_backend(DeviceType::cuda, &fake_);
  }
  void TearDown() override {
    if (!has_device_backend(DeviceType::cuda) || &device_backend(DeviceType::cuda) == &fake_) {
      register_device_backend(DeviceType::cuda, nullptr);
    }
  }
  FakeDeviceBackend fake_;
};

TEST_F(DeviceChecks, MismatchedAndUnsupportedDevices) {
  Tensor c = ones({2, 3});
  Tensor g = raw::to(c, Device::cuda());
  EXPECT_EQ(g.device(), Device::cuda(0));
  EXPECT_EQ(raw::to(g, Device::cpu()).to_vector<float>(), std::vector<float>(6, 1.0f));
  EXPECT_CPF_ERROR(raw::add(c, g), "add: tensors are on different devices: cpu vs cuda:0");
  EXPECT_CPF_ERROR(raw::compare(CompareOp::eq, g, c), "compare: tensors are on different devices: cuda:0 vs cpu");
  EXPECT_CPF_ERROR(raw::add_(c, g), "add_: tensors are on different devices: cpu vs cuda:0");
  EXPECT_CPF_ERROR(raw::where(raw::to(from_vector<bool>({true}, {1}), Device::cuda()), c, c),
                   "where: tensors are on different devices: cuda:0 vs cpu");
  EXPECT_CPF_ERROR(raw::exp(g), "exp: no kernel for device cuda:0 in this build");
  EXPECT_CPF_ERROR(raw::mul(g, g), "mul: no kernel for device cuda:0 in this build");
  EXPECT_CPF_ERROR(raw::mul_(g, 2.0), "mul_: no kernel for device cuda:0 in this build");
  // The other CPU kernel families check the same way.
  EXPECT_CPF_ERROR(raw::matmul(c, raw::to(ones({3, 2}), Device::cuda())),
                   "matmul: tensors are on different devices: cpu vs cuda:0");
  EXPECT_CPF_ERROR(raw::matmul(g, raw::to(ones({3, 2}), Device::cuda())),
                   "matmul: no kernel for device cuda:0 in this build");
  EXPECT_CPF_ERROR(raw::sum(g), "sum: no kernel for device cuda:0 in this build");
  EXPECT_CPF_ERROR(raw::amax(g, {1}), "amax: no kernel for device cuda:0 in this build");
  EXPECT_CPF_ERROR(raw::argmax(g, 0), "argmax: no kernel for device cuda:0 in this build");
}

TEST_F(DeviceChecks, CopiesAcrossDevicesConvertBroadcastAndFollowStrides) {
  // Staged through the host with the backend's byte copies only: no device kernels are needed.
  Tensor host = raw::reshape(arange(0.0, 6.0, 1.0, {.dtype = DType::f32}), {2, 3});
  Tensor g = raw::to(host, Device::cuda());
  Tensor back = zeros({2, 3}, {.dtype = DType::f64});
  raw::copy_(back, g);  // device f32 -> host f64
  EXPECT_EQ(back.to_vector<double>(), (std::vector<double>{0, 1, 2, 3, 4, 5}));
  Tensor g64 = raw::to(g, DType::f64);  // a dtype change that stays on the device
  EXPECT_EQ(g64.device(), Device::cuda());
  EXPECT_EQ(g64.dtype(), DType::f64);
  EXPECT_EQ(g64.to_vector<double>(), (std::vector<double>{0, 1, 2, 3, 4, 5}));
  Tensor gt = raw::transpose(g, 0, 1);  // a strided device view
  EXPECT_EQ(gt.to_vector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  Tensor gc = raw::contiguous(gt);
  EXPECT_EQ(gc.device(), Device::cuda());
  EXPECT_TRUE(gc.is_contiguous());
  EXPECT_EQ(gc.to_vector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  Tensor row = raw::to(from_vector<float>({7, 8, 9}, {3}), Device::cuda());
  Tensor dst = zeros({2, 3}, {.device = Device::cuda()});
  const uint64_t version = dst.version();
  raw::copy_(dst, row);  // broadcast device -> device
  EXPECT_EQ(dst.to_vector<float>(), (std::vector<float>{7, 8, 9, 7, 8, 9}));
  EXPECT_EQ(dst.version(), version + 1);
  raw::fill_(dst, 2.5);
  EXPECT_EQ(dst.to_vector<float>(), std::vector<float>(6, 2.5f));
  EXPECT_EQ(full({2}, 4.0, {.dtype = DType::i32, .device = Device::cuda()}).to_vector<int32_t>(),
            (std::vector<int32_t>{4, 4}));
  EXPECT_CPF_ERROR(raw::copy_(raw::transpose(dst, 0, 1), zeros({3, 2})),
                   "copy_: writing into a cuda:0 tensor needs a contiguous destination, got shape [3,2] strides [1,3]");
  EXPECT_CPF_ERROR(raw::copy_(dst, zeros({4})), "copy_: shapes [2,3] and [4] are not broadcastable");
}

}  // namespace
}  // namespace cpf
