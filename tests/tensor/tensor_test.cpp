// The Tensor handle and everything around it: dtypes, bf16 rounding, devices, creation functions,
// element access, printing, autograd metadata checks and random tensors from the Philox stream.
#include "framework/tensor/tensor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/views.h"
#include "framework/tensor/random.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// ---- dtypes ----

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::f64), 8u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::i32), 4u);
  EXPECT_EQ(dtype_size(DType::i64), 8u);
  EXPECT_EQ(dtype_size(DType::boolean), 1u);
  EXPECT_EQ(sizeof(bfloat16), 2u);
  const std::pair<DType, const char*> names[] = {{DType::f32, "f32"}, {DType::f64, "f64"}, {DType::bf16, "bf16"},
                                                 {DType::i32, "i32"}, {DType::i64, "i64"}, {DType::boolean, "bool"}};
  for (const auto& [dtype, name] : names) {
    EXPECT_EQ(dtype_name(dtype), name);
    EXPECT_EQ(dtype_from_name(name), dtype);
    std::ostringstream os;
    os << dtype;
    EXPECT_EQ(os.str(), name);
  }
  EXPECT_EQ(dtype_from_name("float32"), DType::f32);
  EXPECT_EQ(dtype_from_name("fp32"), DType::f32);
  EXPECT_EQ(dtype_from_name("float64"), DType::f64);
  EXPECT_EQ(dtype_from_name("fp64"), DType::f64);
  EXPECT_EQ(dtype_from_name("bfloat16"), DType::bf16);
  EXPECT_TRUE(is_floating(DType::bf16));
  EXPECT_FALSE(is_floating(DType::i32));
  EXPECT_TRUE(is_integral(DType::boolean));
  EXPECT_FALSE(is_integral(DType::f64));
}

TEST(DType, ParseErrors) {
  EXPECT_CPF_ERROR(dtype_from_name("f16"),
                   "unknown dtype 'f16' (expected one of f32, f64, bf16, i32, i64, bool, f8e4m3, f8e5m2)");
  EXPECT_CPF_ERROR(dtype_from_name(""), "unknown dtype ''");
  EXPECT_CPF_ERROR(dtype_from_name("F32"), "unknown dtype 'F32'");
}

TEST(DType, ComputeDispatchRejectsOtherTypes) {
  EXPECT_CPF_ERROR(visit_compute_dtype(DType::i32, "myop", []<class T>() { return 0; }),
                   "myop: dtype i32 is not supported (expected f32 or f64; bf16 is computed in f32)");
  EXPECT_EQ(visit_compute_dtype(DType::f64, "myop", []<class T>() { return sizeof(T); }), 8u);
}

// ---- bf16 ----

TEST(BFloat16, RoundsToNearestEven) {
  // 1 + 2^-8 is exactly halfway between 1 (even mantissa) and 1 + 2^-7 (odd): ties go to even.
  EXPECT_EQ(bfloat16(1.0f + 0x1p-8f).bits, 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even).
  EXPECT_EQ(bfloat16(1.0f + 3 * 0x1p-8f).bits, 0x3f82);
  // Just above / below the halfway point.
  EXPECT_EQ(bfloat16(1.0f + 0x1p-8f + 0x1p-20f).bits, 0x3f81);
  EXPECT_EQ(bfloat16(1.0f + 0x1p-8f - 0x1p-20f).bits, 0x3f80);
  EXPECT_EQ(bfloat16(-1.0f - 3 * 0x1p-8f).bits, 0xbf82);
  // Exact values are kept.
  for (float v : {0.0f, 1.0f, -2.0f, 0.5f, 1.5f, 256.0f, -0.375f}) EXPECT_EQ(float(bfloat16(v)), v);
  EXPECT_EQ(bfloat16(-0.0f).bits, 0x8000);
  // The largest finite float rounds up to infinity; infinities stay.
  EXPECT_EQ(bfloat16(std::numeric_limits<float>::max()).bits, 0x7f80);
  EXPECT_EQ(bfloat16(std::numeric_limits<float>::infinity()).bits, 0x7f80);
  EXPECT_EQ(bfloat16(-std::numeric_limits<float>::infinity()).bits, 0xff80);
  // Round trip of every bf16 bit pattern that is not NaN.
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const bfloat16 v = bfloat16::from_bits(static_cast<uint16_t>(b));
    const float f = v;
    if (std::isnan(f)) continue;
    ASSERT_EQ(bfloat16(f).bits, b);
  }
}

TEST(BFloat16, NaNStaysNaN) {
  // NaNs whose payload sits only in the low 16 bits would become infinity if simply truncated.
  for (uint32_t bits : {0x7f800001u, 0xff800001u, 0x7fc00000u, 0x7f80ffffu, 0xffffffffu}) {
    const float nan = bits_float(bits);
    ASSERT_TRUE(std::isnan(nan));
    const bfloat16 b(nan);
    EXPECT_TRUE(std::isnan(float(b))) << std::hex << bits;
    EXPECT_EQ(b.bits & 0x8000, (bits >> 16) & 0x8000) << "sign kept";
  }
  EXPECT_EQ(float_bits(float(bfloat16::from_bits(0x3f80))), 0x3f800000u);
}

TEST(BFloat16, TensorConversionRounds) {
  Tensor f = from_vector<float>({1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, std::nanf("")}, {3});
  Tensor b = raw::to(f, DType::bf16);
  EXPECT_EQ(b.dtype(), DType::bf16);
  const auto v = b.to_vector<bfloat16>();
  EXPECT_EQ(v[0].bits, 0x3f80);
  EXPECT_EQ(v[1].bits, 0x3f82);
  EXPECT_TRUE(std::isnan(float(v[2])));
  EXPECT_EQ(b.to_vector<float>()[1], 1.0f + 0x1p-6f);
}

// ---- devices ----

TEST(Device, ParseAndPrint) {
  EXPECT_EQ(Device::parse("cpu"), Device::cpu());
  EXPECT_EQ(Device::parse("cuda"), Device::cuda(0));
  EXPECT_EQ(Device::parse("cuda:0"), Device::cuda(0));
  EXPECT_EQ(Device::parse("cuda:7"), Device::cuda(7));
  EXPECT_EQ(Device::parse("cuda:7").index, 7);
  EXPECT_TRUE(Device::parse("cuda:1").is_cuda());
  EXPECT_TRUE(Device::parse("cpu").is_cpu());
  EXPECT_EQ(Device::cuda(3).str(), "cuda:3");
  EXPECT_EQ(Device::cpu().str(), "cpu");
  EXPECT_EQ(Device(DeviceType::cpu, 5), Device::cpu());  // cpu has no ordinal
  EXPECT_NE(Device::cuda(0), Device::cuda(1));
  std::ostringstream os;
  os << Device::cuda(2);
  EXPECT_EQ(os.str(), "cuda:2");
}

TEST(Device, ParseErrors) {
  EXPECT_CPF_ERROR(Device::parse("gpu"), "invalid device 'gpu' (expected 'cpu', 'cuda' or 'cuda:N')");
  EXPECT_CPF_ERROR(Device::parse("CPU"), "invalid device 'CPU'");
  EXPECT_CPF_ERROR(Device::parse(""), "invalid device ''");
  for (const char* bad : {"cuda:", "cuda:-1", "cuda:1x", "cuda:x", "cuda: 1", "cuda:99999999999"}) {
    EXPECT_CPF_ERROR(Device::parse(bad), std::string("invalid device '") + bad +
                                             "': the index after 'cuda:' must be a non-negative integer");
  }
}

TEST(Device, CudaWithoutBackendGivesAHelpfulError) {
  if (has_device_backend(DeviceType::cuda)) GTEST_SKIP() << "this build has a CUDA backend";
  const char* hint =
      "no backend for device type cuda:0: this build has no CUDA support (configure with "
      "-DCPF_WITH_CUDA=ON";
  EXPECT_CPF_ERROR(empty({2, 3}, {.device = Device::cuda()}), hint);
  EXPECT_CPF_ERROR(zeros({2}, {.device = Device::cuda()}), hint);
  EXPECT_CPF_ERROR(raw::to(ones({2}), Device::cuda()), hint);
  EXPECT_CPF_ERROR(from_vector<float>({1, 2}, {2}, Device::cuda(1)), "no backend for device type cuda");
  EXPECT_CPF_ERROR(device_backend(DeviceType::cuda), hint);
  EXPECT_TRUE(has_device_backend(DeviceType::cpu));
}

// ---- creation ----

TEST(Creation, EmptyGeometry) {
  Tensor t = empty({2, 3, 4});
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(t.strides(), (Shape{12, 4, 1}));
  EXPECT_EQ(t.offset(), 0);
  EXPECT_EQ(t.dim(), 3);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_EQ(t.size(0), 2);
  EXPECT_EQ(t.stride(-3), 12);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.dtype(), DType::f32);
  EXPECT_EQ(t.device(), Device::cpu());
  EXPECT_EQ(t.storage()->nbytes(), 24u * 4u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % 64, 0u) << "host storage is 64-byte aligned";
  EXPECT_TRUE(t.is_leaf());
  EXPECT_FALSE(t.requires_grad());
  EXPECT_FALSE(t.grad().defined());

  Tensor scalar = empty({});
  EXPECT_EQ(scalar.dim(), 0);
  EXPECT_EQ(scalar.numel(), 1);
  Tensor none = empty({3, 0}, {.dtype = DType::i64});
  EXPECT_EQ(none.numel(), 0);
  EXPECT_EQ(none.strides(), (Shape{1, 1}));
  EXPECT_TRUE(none.to_vector<int64_t>().empty());
}

TEST(Creation, GeometryErrors) {
  Tensor t = empty({2, 3});
  EXPECT_CPF_ERROR(empty({2, -1}), "empty: negative dimension in shape [2,-1]");
  EXPECT_CPF_ERROR(t.size(2), "size: dim 2 out of range for a tensor of rank 2 (expected -2..1)");
  EXPECT_CPF_ERROR(t.size(-3), "size: dim -3 out of range for a tensor of rank 2 (expected -2..1)");
  EXPECT_CPF_ERROR(t.stride(5), "stride: dim 5 out of range");
  EXPECT_CPF_ERROR(empty({}).size(0), "size: a tensor of rank 0 has no dims");
  EXPECT_CPF_ERROR(empty({}).stride(-1), "stride: a tensor of rank 0 has no dims");
  Tensor undefined;
  EXPECT_FALSE(undefined.defined());
  EXPECT_CPF_ERROR(undefined.shape(), "operation on an undefined tensor");
  EXPECT_CPF_ERROR(undefined.numel(), "operation on an undefined tensor");
  EXPECT_CPF_ERROR(make_tensor(t.storage(), {2, 3}, {3}, 0, DType::f32),
                   "make_tensor: shape [2,3] and strides [3] differ in rank");
}

TEST(Creation, FilledTensorsOfEveryDType) {
  for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::i32, DType::i64, DType::boolean}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor z = zeros({2, 3}, {.dtype = dtype});
    Tensor o = ones({2, 3}, {.dtype = dtype});
    EXPECT_EQ(z.dtype(), dtype);
    EXPECT_EQ(z.shape(), (Shape{2, 3}));
    EXPECT_EQ(z.to_vector<double>(), std::vector<double>(6, 0.0));
    EXPECT_EQ(o.to_vector<double>(), std::vector<double>(6, 1.0));
    const double value = dtype == DType::boolean ? 1.0 : 3.0;
    EXPECT_EQ(full({4}, value, {.dtype = dtype}).to_vector<double>(), std::vector<double>(4, value));
    EXPECT_EQ(zeros_like(o).dtype(), dtype);
    EXPECT_EQ(zeros_like(o).shape(), o.shape());
    EXPECT_EQ(ones_like(z).to_vector<double>(), std::vector<double>(6, 1.0));
    EXPECT_EQ(empty_like(z).shape(), (Shape{2, 3}));
    EXPECT_EQ(full_like(z, value).to_vector<double>(), std::vector<double>(6, value));
  }
  EXPECT_EQ(full({2}, 2.7, {.dtype = DType::i32}).to_vector<int32_t>(), (std::vector<int32_t>{2, 2}));
  EXPECT_EQ(full({}, 1.0 + 0x1p-8, {.dtype = DType::bf16}).item<float>(), 1.0f);  // rounded once
  Tensor s = scalar_tensor(-1.5, {.dtype = DType::f64});
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.item<double>(), -1.5);
  // _like takes a non-contiguous input's shape and gives a fresh contiguous tensor.
  Tensor tr = raw::transpose(zeros({2, 5}), 0, 1);
  EXPECT_EQ(ones_like(tr).shape(), (Shape{5, 2}));
  EXPECT_TRUE(ones_like(tr).is_contiguous());
}

TEST(Creation, RequiresGradOption) {
  Tensor z = zeros({2}, {.requires_grad = true});
  EXPECT_TRUE(z.requires_grad());
  EXPECT_TRUE(z.is_leaf());
  EXPECT_TRUE(full({2}, 1.0, {.dtype = DType::f64, .requires_grad = true}).requires_grad());
  EXPECT_TRUE(empty({2}, {.dtype = DType::bf16, .requires_grad = true}).requires_grad());
  EXPECT_TRUE(arange(0.0, 3.0, 1.0, {.dtype = DType::f32, .requires_grad = true}).requires_grad());
  EXPECT_CPF_ERROR(zeros({2}, {.dtype = DType::i64, .requires_grad = true}),
                   "set_requires_grad: only floating tensors can require grad, got i64");
}

TEST(Creation, Arange) {
  Tensor a = arange(5);
  EXPECT_EQ(a.dtype(), DType::i64);
  EXPECT_EQ(a.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(arange(0.0, 1.0, 0.25, {.dtype = DType::f32}).to_vector<float>(),
            (std::vector<float>{0, 0.25f, 0.5f, 0.75f}));
  EXPECT_EQ(arange(5.0, 0.0, -2.0).to_vector<int64_t>(), (std::vector<int64_t>{5, 3, 1}));
  EXPECT_EQ(arange(2.0, 2.0).numel(), 0);
  EXPECT_EQ(arange(0).numel(), 0);
  EXPECT_EQ(arange(1.0, 2.0, 0.3, {.dtype = DType::f64}).numel(), 4);  // 1, 1.3, 1.6, 1.9
  EXPECT_EQ(arange(3, {.dtype = DType::f64}).to_vector<double>(), (std::vector<double>{0, 1, 2}));
  EXPECT_CPF_ERROR(arange(0.0, 1.0, 0.0), "arange: step must be non-zero");
  EXPECT_CPF_ERROR(arange(0.0, 5.0, -1.0), "arange: step -1 does not move from 0 towards 5");
  EXPECT_CPF_ERROR(arange(0.0, std::nan(""), 1.0), "arange:");
}

TEST(Creation, FromBufferAndVector) {
  const double raw_values[] = {1.5, -2, 3, 4, 5, 6};
  Tensor t = from_buffer(raw_values, {2, 3}, DType::f64);
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  EXPECT_EQ(t.to_vector<double>(), std::vector<double>(std::begin(raw_values), std::end(raw_values)));
  EXPECT_NE(t.raw_data(), static_cast<const void*>(raw_values)) << "from_buffer copies";
  Tensor v = from_vector<int32_t>({1, 2, 3, 4}, {2, 2});
  EXPECT_EQ(v.dtype(), DType::i32);
  EXPECT_EQ(v.to_vector<int32_t>(), (std::vector<int32_t>{1, 2, 3, 4}));
  Tensor b = from_vector<bool>({true, false}, {2});
  EXPECT_EQ(b.dtype(), DType::boolean);
  EXPECT_EQ(b.to_vector<double>(), (std::vector<double>{1, 0}));
  EXPECT_EQ(from_buffer(nullptr, {0, 4}, DType::f32).numel(), 0);
  EXPECT_CPF_ERROR(from_vector<float>({1, 2, 3, 4, 5}, {2, 3}), "from_vector: 5 values do not fill shape [2,3]");
  EXPECT_CPF_ERROR(from_buffer(nullptr, {2}, DType::f32), "from_buffer: null host pointer for shape [2]");
}

// ---- element access ----

TEST(Access, ItemAndToVector) {
  Tensor t = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(raw::select(raw::select(t, 0, 1), 0, 2).item<float>(), 6.0f);
  EXPECT_EQ(raw::select(raw::select(t, 1, 1), 0, 1).item<int64_t>(), 5);  // converted
  EXPECT_EQ(from_vector<float>({2.5f}, {1, 1}).item<double>(), 2.5);
  EXPECT_TRUE(from_vector<float>({2.5f}, {1}).item<bool>());
  EXPECT_EQ(from_vector<double>({-1e-300}, {}).item<bool>(), true) << "tiny non-zero doubles are true";
  EXPECT_CPF_ERROR(t.item<float>(), "item() needs exactly one element, got shape [2,3]");
  EXPECT_CPF_ERROR(empty({0}).item<float>(), "item() needs exactly one element, got shape [0]");
  // Non-contiguous views come out in row-major order of the view.
  EXPECT_EQ(raw::transpose(t, 0, 1).to_vector<float>(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
  EXPECT_EQ(raw::transpose(t, 0, 1).to_vector<int32_t>(), (std::vector<int32_t>{1, 4, 2, 5, 3, 6}));
  EXPECT_EQ(raw::slice(t, 1, 0, 3, 2).to_vector<double>(), (std::vector<double>{1, 3, 4, 6}));
  EXPECT_EQ(*t.data<float>(), 1.0f);
  EXPECT_EQ(raw::select(t, 0, 1).data<float>()[0], 4.0f) << "data() points at the view's first element";
  EXPECT_CPF_ERROR(t.data<double>(), "data<f64>() on a f32 tensor");
  EXPECT_CPF_ERROR(t.data<int32_t>(), "data<i32>() on a f32 tensor");
}

TEST(Access, DetachSharesStorageAndVersion) {
  Tensor t = zeros({3}, {.requires_grad = true});
  Tensor d = t.detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_TRUE(d.is_leaf());
  EXPECT_EQ(d.storage(), t.storage());
  EXPECT_FALSE(d.is_same(t));
  const uint64_t v = t.version();
  raw::fill_(d, 2.0);
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{2, 2, 2}));
  EXPECT_GT(t.version(), v);
  EXPECT_EQ(t.version(), d.version());
  t.bump_version();
  EXPECT_EQ(t.version(), d.version());
}

TEST(Access, SetRequiresGradAndGradChecks) {
  Tensor i = zeros({2}, {.dtype = DType::i32});
  EXPECT_CPF_ERROR(i.set_requires_grad(), "set_requires_grad: only floating tensors can require grad, got i32");
  EXPECT_CPF_ERROR(zeros({2}, {.dtype = DType::boolean}).set_requires_grad(true), "got bool");
  i.set_requires_grad(false);  // turning it off is always fine on a leaf
  EXPECT_FALSE(i.requires_grad());
  Tensor f = zeros({2, 2});
  EXPECT_TRUE(f.set_requires_grad().requires_grad());
  EXPECT_FALSE(f.set_requires_grad(false).requires_grad());
  EXPECT_CPF_ERROR(f.set_grad(zeros({3})), "set_grad: gradient shape [3] differs from tensor shape [2,2]");
  f.set_grad(ones({2, 2}));
  EXPECT_EQ(f.grad().to_vector<float>(), std::vector<float>(4, 1.0f));
  f.set_grad(Tensor());
  EXPECT_FALSE(f.grad().defined());
}

// ---- printing ----

TEST(Print, SmallTensors) {
  Tensor t = from_vector<float>({1, 2.5f, -3, 4}, {2, 2});
  EXPECT_EQ(t.str(),
            "tensor([[1.0000, 2.5000],\n"
            "        [-3.0000, 4.0000]], dtype=f32, device=cpu, shape=[2,2])");
  EXPECT_EQ(arange(3).str(), "tensor([0, 1, 2], dtype=i64, device=cpu, shape=[3])");
  EXPECT_EQ(scalar_tensor(3.25).str(), "tensor(3.2500, dtype=f32, device=cpu, shape=[])");
  EXPECT_EQ(scalar_tensor(7, {.dtype = DType::i32}).str(), "tensor(7, dtype=i32, device=cpu, shape=[])");
  EXPECT_EQ(from_vector<bool>({true, false}, {2}).str(), "tensor([true, false], dtype=bool, device=cpu, shape=[2])");
  EXPECT_EQ(zeros({2}, {.dtype = DType::f64, .requires_grad = true}).str(),
            "tensor([0.0000, 0.0000], dtype=f64, device=cpu, shape=[2], requires_grad)");
  EXPECT_EQ(empty({0}).str(), "tensor([], dtype=f32, device=cpu, shape=[0])");
  EXPECT_EQ(Tensor().str(), "tensor(undefined)");
  // A transposed view prints in its own row-major order.
  EXPECT_EQ(raw::transpose(from_vector<int64_t>({1, 2, 3, 4}, {2, 2}), 0, 1).str(),
            "tensor([[1, 3],\n"
            "        [2, 4]], dtype=i64, device=cpu, shape=[2,2])");
  std::ostringstream os;
  os << arange(2);
  EXPECT_EQ(os.str(), "tensor([0, 1], dtype=i64, device=cpu, shape=[2])");
  // Printing does not change the stream state of later, unrelated output.
  std::ostringstream os2;
  os2 << t << ' ' << 0.125;
  EXPECT_NE(os2.str().find(") 0.125"), std::string::npos) << os2.str();
}

TEST(Print, LargeTensorsAreTruncated) {
  const std::string s = arange(2000).str();
  EXPECT_NE(s.find("[0, 1, 2, ..., 1997, 1998, 1999]"), std::string::npos) << s;
  EXPECT_NE(s.find("shape=[2000]"), std::string::npos);
  EXPECT_LT(s.size(), 120u);
  const std::string m = raw::reshape(arange(100 * 100), {100, 100}).str();
  EXPECT_LT(m.size(), 600u);
  EXPECT_NE(m.find("[[0, 1, 2, ..., 97, 98, 99],\n"), std::string::npos) << m;
  EXPECT_NE(m.find("...,\n"), std::string::npos) << m;
  EXPECT_NE(m.find("[9900, 9901, 9902, ..., 9997, 9998, 9999]]"), std::string::npos) << m;
  // Below the threshold everything is printed.
  EXPECT_EQ(arange(20).str().find("..."), std::string::npos);
}

// ---- random tensors ----

TEST(Random, UniformRangeMeanAndVariance) {
  for (DType dtype : {DType::f32, DType::f64, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    Generator gen(17);
    Tensor u = rand({400000}, {.dtype = dtype}, &gen);
    EXPECT_EQ(u.dtype(), dtype);
    const auto v = u.to_vector<double>();
    double sum = 0, sum_sq = 0, lo = 1, hi = 0;
    for (double x : v) {
      sum += x;
      sum_sq += x * x;
      lo = std::min(lo, x);
      hi = std::max(hi, x);
    }
    EXPECT_GE(lo, 0.0);
    EXPECT_LT(hi, 1.0) << "the upper bound is excluded in every dtype";
    const double mean = sum / v.size(), var = sum_sq / v.size() - mean * mean;
    EXPECT_NEAR(mean, 0.5, 0.003);
    EXPECT_NEAR(var, 1.0 / 12, 0.002);
  }
  Generator gen(3);
  const auto w = uniform({100000}, -3.0, 5.0, {.dtype = DType::f64}, &gen).to_vector<double>();
  double sum = 0, lo = 5, hi = -3;
  for (double x : w) {
    sum += x;
    lo = std::min(lo, x);
    hi = std::max(hi, x);
  }
  EXPECT_GE(lo, -3.0);
  EXPECT_LT(hi, 5.0);
  EXPECT_NEAR(sum / w.size(), 1.0, 0.04);
  // A narrow range in low precision still excludes its upper bound.
  Generator narrow_gen(4);
  for (double x : uniform({20000}, 1.0, 1.0 + 0x1p-5, {.dtype = DType::bf16}, &narrow_gen).to_vector<double>()) {
    ASSERT_GE(x, 1.0);
    ASSERT_LT(x, 1.0 + 0x1p-5);
  }
  EXPECT_EQ(uniform({3}, 2.0, 2.0).to_vector<float>(), (std::vector<float>{2, 2, 2}));
  EXPECT_CPF_ERROR(uniform({2}, 1.0, 0.0), "uniform: low=1 must not exceed high=0");
}

TEST(Random, NormalMeanAndVariance) {
  Generator gen(23);
  const auto v = normal({400000}, 2.0, 3.0, {.dtype = DType::f64}, &gen).to_vector<double>();
  double sum = 0, sum_sq = 0;
  for (double x : v) {
    sum += x;
    sum_sq += x * x;
  }
  const double mean = sum / v.size(), var = sum_sq / v.size() - mean * mean;
  EXPECT_NEAR(mean, 2.0, 0.025);  // sigma 4.7e-3
  EXPECT_NEAR(var, 9.0, 0.11);    // sigma 9 * sqrt(2/n) = 0.02
  Generator gen2(23);
  const auto z = randn({1000}, {.dtype = DType::f32}, &gen2).to_vector<float>();
  for (size_t i = 0; i < z.size(); ++i) ASSERT_NEAR(z[i], (v[i] - 2.0) / 3.0, 1e-5) << i;
  EXPECT_CPF_ERROR(normal({2}, 0.0, -1.0), "normal: stddev=-1 must be non-negative");
  EXPECT_EQ(normal({2}, 4.0, 0.0).to_vector<float>(), (std::vector<float>{4, 4}));
}

TEST(Random, DeterministicBySeedAndOffset) {
  Generator a(99), b(99), c(100);
  const auto x = rand({64}, {.dtype = DType::f64}, &a).to_vector<double>();
  EXPECT_EQ(x, rand({64}, {.dtype = DType::f64}, &b).to_vector<double>());
  EXPECT_NE(x, rand({64}, {.dtype = DType::f64}, &c).to_vector<double>());
  EXPECT_EQ(a.offset(), 64u);
  // The second draw continues the stream, so it differs from the first.
  EXPECT_NE(x, rand({64}, {.dtype = DType::f64}, &a).to_vector<double>());
  // Restoring (seed, offset) replays exactly.
  Generator d(0);
  d.set_state(99, 64);
  EXPECT_EQ(rand({64}, {.dtype = DType::f64}, &d).to_vector<double>(),
            rand({64}, {.dtype = DType::f64}, &b).to_vector<double>());
  // The default generator follows manual_seed.
  manual_seed(5);
  const auto y = randn({10}).to_vector<float>();
  manual_seed(5);
  EXPECT_EQ(y, randn({10}).to_vector<float>());
  // Element i depends only on (seed, offset + i): values do not depend on the shape.
  Generator e(7), f(7);
  EXPECT_EQ(randn({2, 3}, {.dtype = DType::f64}, &e).to_vector<double>(),
            randn({6}, {.dtype = DType::f64}, &f).to_vector<double>());
}

TEST(Random, TwoDrawsEqualOneDraw) {
  // Large enough that the parallel fill path is taken.
  const int64_t n = (1 << 17) + 3, first = 1000;
  Generator whole(31), split(31);
  const auto all = randn({n}, {.dtype = DType::f64}, &whole).to_vector<double>();
  auto head = randn({first}, {.dtype = DType::f64}, &split).to_vector<double>();
  const auto tail = randn({n - first}, {.dtype = DType::f64}, &split).to_vector<double>();
  head.insert(head.end(), tail.begin(), tail.end());
  EXPECT_EQ(all, head);
  EXPECT_EQ(whole.offset(), split.offset());
}

TEST(Random, Randint) {
  Generator gen(8);
  Tensor r = randint(-3, 4, {50000}, {.dtype = DType::i64}, &gen);
  EXPECT_EQ(r.dtype(), DType::i64);
  std::vector<int> counts(7, 0);
  for (int64_t x : r.to_vector<int64_t>()) {
    ASSERT_GE(x, -3);
    ASSERT_LT(x, 4);
    counts[static_cast<size_t>(x + 3)] += 1;
  }
  for (int c : counts) EXPECT_NEAR(c, 50000 / 7, 400);  // sigma 78
  EXPECT_EQ(randint(0, 10, {5}, {.dtype = DType::i32}).dtype(), DType::i32);
  EXPECT_CPF_ERROR(randint(3, 3, {2}), "randint: empty range [3, 3)");
}

}  // namespace
}  // namespace cpf
