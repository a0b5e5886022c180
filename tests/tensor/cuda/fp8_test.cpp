// The FP8 kernels on the GPU (framework/tensor/cuda/fp8.cu, fp8_ops.cpp) against the CPU reference
// (framework/tensor/ops/fp8.cpp): the casts bit for bit (every FP8 code's neighbourhood, ties, saturation,
// NaN, subnormals, f32 and bf16 inputs), amax and the scale rule exactly, and cuBLASLt's FP8 GEMM against
// the CPU's product of the same quantised values (they differ only in the order of the f32 additions).
#include "framework/tensor/ops/fp8.h"
#include "framework/tensor/ops/views.h"

#include <cmath>
#include <limits>
#include <vector>

#include "cuda_test_utils.h"
#include "framework/autograd/engine.h"
#include "framework/autograd/functions/fp8_linear.h"
#include "framework/tensor/float8.h"
#include "framework/tensor/ops/fp8_scale_update.h"

namespace cpf {
namespace {

using testing::on_cpu;
using testing::on_gpu;
using testing::random_cpu;

class CudaFp8Test : public testing::CudaTest {};

Tensor scalar(float v, Device device = Device::cpu()) {
  return raw::to(from_vector(std::vector<float>{v}, {}), device);
}
float value_of(const Tensor& t) { return on_cpu(t).to_vector<float>()[0]; }

// Values around every code of both formats (the codes, their midpoints, and just off the midpoints),
// beyond the ranges, subnormals, zeros, infinities and NaN.
std::vector<float> hard_values() {
  std::vector<float> v = {
      0.0f,   -0.0f,  INFINITY, -INFINITY, NAN,      1e30f,    -1e30f,
      1e-30f, 448.0f, 464.0f,   480.0f,    57344.0f, 61440.0f, std::numeric_limits<float>::denorm_min()};
  for (int b = 0; b < 255; ++b) {
    for (float c : {static_cast<float>(float8_e4m3::from_bits(b)), static_cast<float>(float8_e5m2::from_bits(b))}) {
      if (!std::isfinite(c)) continue;
      v.insert(v.end(), {c, std::nextafter(c, INFINITY), std::nextafter(c, -INFINITY)});
    }
    const std::pair<float, float> neighbours[] = {
        {static_cast<float>(float8_e4m3::from_bits(b)), static_cast<float>(float8_e4m3::from_bits(b + 1))},
        {static_cast<float>(float8_e5m2::from_bits(b)), static_cast<float>(float8_e5m2::from_bits(b + 1))}};
    for (const auto& [lo, hi] : neighbours) {
      if (!std::isfinite(lo) || !std::isfinite(hi)) continue;
      const float mid = 0.5f * (lo + hi);  // exact: the codes have few mantissa bits
      v.insert(v.end(), {mid, std::nextafter(mid, INFINITY), std::nextafter(mid, -INFINITY)});
    }
  }
  return v;
}

void expect_same_codes(const Tensor& gpu, const Tensor& cpu, const std::string& what) {
  ASSERT_EQ(gpu.dtype(), cpu.dtype()) << what;
  const Tensor g = on_cpu(gpu);
  const auto* gb = static_cast<const uint8_t*>(g.raw_data());
  const auto* cb = static_cast<const uint8_t*>(cpu.raw_data());
  int64_t mismatches = 0;
  for (int64_t i = 0; i < cpu.numel(); ++i) {
    const bool nan_g = (gb[i] & 0x7f) == 0x7f || (cpu.dtype() == DType::f8e5m2 && (gb[i] & 0x7f) > 0x7c);
    const bool nan_c = (cb[i] & 0x7f) == 0x7f || (cpu.dtype() == DType::f8e5m2 && (cb[i] & 0x7f) > 0x7c);
    if (nan_g && nan_c) continue;
    if (gb[i] != cb[i] && ++mismatches <= 5)
      ADD_FAILURE() << what << ": element " << i << " gpu " << int(gb[i]) << " cpu " << int(cb[i]);
  }
  EXPECT_EQ(mismatches, 0) << what;
}

TEST_F(CudaFp8Test, CastsEqualTheCpuBitForBit) {
  const std::vector<float> values = hard_values();
  const Tensor x = from_vector(values, {static_cast<int64_t>(values.size())});
  for (DType fp8 : {DType::f8e4m3, DType::f8e5m2}) {
    for (DType in : {DType::f32, DType::bf16}) {
      for (float s : {1.0f, 3.0f, 0.0078125f}) {
        const Tensor xi = raw::to(x, in);
        const Tensor amax_cpu = scalar(0.5f), amax_gpu = scalar(0.5f, Device::cuda(0));
        const Tensor qc = raw::quantize_fp8(xi, scalar(s), fp8, amax_cpu);
        const Tensor qg = raw::quantize_fp8(on_gpu(xi), scalar(s, Device::cuda(0)), fp8, amax_gpu);
        const std::string what = dtype_name(in) + " -> " + dtype_name(fp8) + " scale " + std::to_string(s);
        expect_same_codes(qg, qc, what);
        EXPECT_TRUE(std::isnan(value_of(amax_gpu)) && std::isnan(value_of(amax_cpu))) << what;  // x holds a NaN
        for (DType out : {DType::f32, DType::bf16}) {
          const Tensor dc = raw::dequantize_fp8(qc, scalar(0.25f), out);
          const Tensor dg = raw::dequantize_fp8(on_gpu(qc), scalar(0.25f, Device::cuda(0)), out);
          const std::vector<float> a = raw::to(dc, DType::f32).to_vector<float>();
          const std::vector<float> b = raw::to(on_cpu(dg), DType::f32).to_vector<float>();
          for (size_t i = 0; i < a.size(); ++i) {
            if (std::isnan(a[i]) && std::isnan(b[i])) continue;
            ASSERT_EQ(a[i], b[i]) << what << " dequantized to " << dtype_name(out) << " at " << i;
          }
        }
      }
    }
  }
}

TEST_F(CudaFp8Test, TransposedCastEqualsTheCpuBitForBit) {
  // Tile edges: sizes off 32 in both dims, and one tile exactly; multiples of 64 (the vectorised 64 x 64
  // tiles): one tile, and several in both dims.
  for (const auto& [rows, cols] :
       {std::pair<int64_t, int64_t>{100, 70}, {32, 32}, {1, 33}, {257, 16}, {64, 64}, {192, 320}}) {
    for (DType in : {DType::f32, DType::bf16}) {
      const Tensor x = random_cpu({rows, cols}, in, static_cast<uint64_t>(rows * cols), -300.0, 300.0);
      const Tensor amax_cpu = scalar(0.0f), amax_gpu = scalar(0.0f, Device::cuda(0));
      const raw::Fp8Transposed c = raw::quantize_fp8_transposed(x, scalar(1.5f), DType::f8e4m3, amax_cpu);
      const raw::Fp8Transposed g =
          raw::quantize_fp8_transposed(on_gpu(x), scalar(1.5f, Device::cuda(0)), DType::f8e4m3, amax_gpu);
      const std::string what = std::to_string(rows) + "x" + std::to_string(cols) + " " + dtype_name(in);
      expect_same_codes(g.q, c.q, what + " q");
      expect_same_codes(g.qt, c.qt, what + " qt");
      EXPECT_EQ(value_of(amax_gpu), value_of(amax_cpu)) << what;
      const raw::Fp8Transposed only_t =
          raw::quantize_fp8_transposed(on_gpu(x), scalar(1.5f, Device::cuda(0)), DType::f8e4m3, Tensor(), false);
      expect_same_codes(only_t.qt, c.qt, what + " qt alone");
    }
  }
}

TEST_F(CudaFp8Test, AmaxAndScaleEqualTheCpu) {
  for (DType dtype : {DType::f32, DType::bf16, DType::f64}) {
    // 37,000 values: 16-byte vectors; 999: a scalar tail after them; one element in: unaligned, scalar.
    const Tensor x = random_cpu({1000, 37}, dtype, 5, -3.0, 2.0);
    EXPECT_EQ(value_of(raw::abs_max(on_gpu(x))), value_of(raw::abs_max(x))) << dtype_name(dtype);
    const Tensor tail = random_cpu({999}, dtype, 6, -3.0, 2.0);
    EXPECT_EQ(value_of(raw::abs_max(on_gpu(tail))), value_of(raw::abs_max(tail))) << dtype_name(dtype);
    const Tensor flat = raw::reshape(x, {37000});
    EXPECT_EQ(value_of(raw::abs_max(raw::narrow(on_gpu(flat), 0, 1, 36999))),
              value_of(raw::abs_max(raw::narrow(flat, 0, 1, 36999))))
        << dtype_name(dtype);
  }
  EXPECT_EQ(value_of(raw::abs_max(on_gpu(empty({0})))), 0.0f);
  const Tensor with_nan = from_vector(std::vector<float>{1.0f, -INFINITY, NAN, 2.0f}, {4});
  EXPECT_TRUE(std::isnan(value_of(raw::abs_max(on_gpu(with_nan)))));
  const Device gpu = Device::cuda(0);
  for (float a : {7.0f, 0.001f, 3e38f, 0.0f, INFINITY, NAN}) {
    for (int64_t margin : {0, 3}) {
      for (DType fp8 : {DType::f8e4m3, DType::f8e5m2}) {
        const float cpu = value_of(raw::fp8_scale(scalar(a), fp8, margin, scalar(2.5f)));
        const float dev = value_of(raw::fp8_scale(scalar(a, gpu), fp8, margin, scalar(2.5f, gpu)));
        EXPECT_EQ(cpu, dev) << "amax " << a << " margin " << margin << " " << dtype_name(fp8);
      }
    }
  }
  EXPECT_EQ(value_of(raw::fp8_scale(scalar(NAN, gpu), DType::f8e4m3)), 1.0f);
}

// The GPU GEMM against the CPU's product of the same quantised operands (fast: cuBLASLt's fast accumulation).
void expect_gemm_matches(int64_t m, int64_t n, int64_t k, DType a_type, DType b_type, bool with_bias, DType out,
                         bool fast = false) {
  const Tensor x = random_cpu({m, k}, DType::f32, 7, -2.0, 2.0);
  const Tensor w = random_cpu({n, k}, DType::f32, 8, -0.05, 0.05);
  const Tensor sx = raw::fp8_scale(raw::abs_max(x), a_type), sw = raw::fp8_scale(raw::abs_max(w), b_type);
  const Tensor xq = raw::quantize_fp8(x, sx, a_type), wq = raw::quantize_fp8(w, sw, b_type);
  const Tensor sx_inv = scalar(1.0f / value_of(sx)), sw_inv = scalar(1.0f / value_of(sw));
  const Tensor bias = with_bias ? raw::to(random_cpu({n}, DType::f32, 9), out) : Tensor();
  const Tensor cpu = raw::fp8_matmul_nt(xq, sx_inv, wq, sw_inv, out, bias);
  const Tensor gpu = raw::fp8_matmul_nt(on_gpu(xq), on_gpu(sx_inv), on_gpu(wq), on_gpu(sw_inv), out,
                                        with_bias ? on_gpu(bias) : Tensor(), fast);
  const std::string what = std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) + " " +
                           dtype_name(a_type) + " x " + dtype_name(b_type) + " -> " + dtype_name(out) +
                           (with_bias ? " + bias" : "") + (fast ? ", fast accumulation" : "");
  // bf16 output: one bf16 rounding. f32 output: Hopper's FP8 tensor cores keep their partial sums in fewer
  // bits than f32 (measured on an H100, 2026-12-07: 5.5e-5 relative at K = 64), so 1e-4, not f32's few ulps.
  const double tol = out == DType::bf16 ? 1.0 / 128 : 1e-4;
  EXPECT_LT(testing::rel_error(raw::to(on_cpu(gpu), DType::f32), raw::to(cpu, DType::f32)), tol) << what;
}

TEST_F(CudaFp8Test, GemmEqualsTheCpuProductOfTheSameQuantisedValues) {
  expect_gemm_matches(64, 48, 128, DType::f8e4m3, DType::f8e4m3, false, DType::bf16);
  expect_gemm_matches(64, 48, 128, DType::f8e4m3, DType::f8e4m3, true, DType::bf16);
  expect_gemm_matches(33, 16, 64, DType::f8e5m2, DType::f8e4m3, false, DType::f32);  // a gradient GEMM's types
  expect_gemm_matches(33, 16, 64, DType::f8e4m3, DType::f8e5m2, true, DType::f32);
  expect_gemm_matches(512, 768, 1024, DType::f8e4m3, DType::f8e4m3, true, DType::bf16);  // a GPT-2 layer's shape
}

// Fast accumulation (the forward's option, fp8.fast_forward_accumulation) keeps its partial sums in the tensor
// cores' own precision for all of K: still within a bf16 output's rounding of the exact product at K = 1024
// and at K = 8192 (the 1B shape's down projection).
TEST_F(CudaFp8Test, FastAccumulationStaysWithinBf16OfTheExactProduct) {
  expect_gemm_matches(64, 48, 128, DType::f8e4m3, DType::f8e4m3, true, DType::bf16, true);
  expect_gemm_matches(512, 768, 1024, DType::f8e4m3, DType::f8e4m3, true, DType::bf16, true);
  expect_gemm_matches(256, 256, 8192, DType::f8e4m3, DType::f8e4m3, false, DType::bf16, true);
}

TEST_F(CudaFp8Test, GemmRefusesShapesCublasLtCannotRun) {
  const Tensor one = scalar(1.0f, Device::cuda(0));
  const Tensor a = raw::quantize_fp8(on_gpu(random_cpu({8, 24}, DType::f32, 1)), one, DType::f8e4m3);
  EXPECT_CPF_ERROR(raw::fp8_matmul_nt(a, one, a, one, DType::bf16),
                   "fp8_matmul_nt (cuda): K = 24 and N = 8 must be multiples of 16");
  EXPECT_CPF_ERROR(raw::fp8_matmul_nt(a, scalar(1.0f), a, one, DType::bf16),
                   "fp8_matmul_nt: a_scale_inv is on cpu but the data is on cuda:0");
}

// The column sums from the transposing cast (a linear's bias gradient): the 64 x 64 tiles' partial sums and
// the other shapes' separate pass against the CPU's f64 sums, and the codes unchanged by them.
TEST_F(CudaFp8Test, TransposedCastColumnSumsEqualTheCpu) {
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{100, 70}, {1, 33}, {192, 320}, {4096, 128}}) {
    for (DType in : {DType::f32, DType::bf16}) {
      const Tensor x = random_cpu({rows, cols}, in, static_cast<uint64_t>(rows + cols), -3.0, 3.0);
      const raw::Fp8Transposed c = raw::quantize_fp8_transposed(x, scalar(2.0f), DType::f8e5m2, Tensor(), true, true);
      const raw::Fp8Transposed g =
          raw::quantize_fp8_transposed(on_gpu(x), scalar(2.0f, Device::cuda(0)), DType::f8e5m2, Tensor(), true, true);
      const std::string what = std::to_string(rows) + "x" + std::to_string(cols) + " " + dtype_name(in);
      expect_same_codes(g.qt, c.qt, what + " qt");
      expect_same_codes(g.q, c.q, what + " q");
      ASSERT_EQ(g.column_sums.shape(), (Shape{cols})) << what;
      // f32 sums of up to 4096 terms against f64's: a few f32 roundings of the running sum.
      EXPECT_LT(testing::rel_error(on_cpu(g.column_sums), c.column_sums), 1e-5) << what;
    }
  }
}

// fp8_linear's forward and gradients on the GPU against the CPU: the same scales and casts (bit for bit,
// above), so the operands of every GEMM are identical and only the f32 sums' order differs.
TEST_F(CudaFp8Test, LinearEqualsTheCpuForwardAndBackward) {
  const int64_t m = 64, k = 96, n = 48;
  const Tensor x = raw::to(random_cpu({m, k}, DType::f32, 21), DType::bf16);
  const Tensor w = random_cpu({n, k}, DType::f32, 22, -0.1, 0.1);
  const Tensor bias = random_cpu({n}, DType::f32, 23);
  const Tensor gy = raw::to(random_cpu({m, n}, DType::f32, 24), DType::bf16);
  std::vector<Tensor> results[2];
  for (int on_device = 0; on_device < 2; ++on_device) {
    const auto place = [&](const Tensor& t) { return on_device ? on_gpu(t) : t; };
    Tensor xi = place(x).set_requires_grad(true), wi = place(w).set_requires_grad(true);
    Tensor bi = place(bias).set_requires_grad(true);
    const Tensor y = fp8_linear(xi, wi, bi);
    backward(y, place(gy));
    for (const Tensor& t : {y, xi.grad(), wi.grad(), bi.grad()})
      results[on_device].push_back(on_cpu(raw::to(t, DType::f32)));
  }
  const char* names[] = {"y", "dx", "dw", "db"};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_LT(testing::rel_error(results[1][i], results[0][i]), i == 1 || i == 0 ? 1.0 / 128 : 1e-4) << names[i];
  }
}

// Delayed scaling's update (fp8_scale_update.h): the kernel equals the CPU bit for bit, with zero, finite,
// infinite and NaN amaxes, both amax rules, a margin, and a skipped step (NaN flag) that drops them all;
// the count of clipped entries too.
TEST_F(CudaFp8Test, ScaleUpdateEqualsTheCpuBitForBit) {
  const int64_t entries = 300, length = 5;  // more entries than one block of threads
  std::vector<float> amax(entries), max(entries);
  for (int64_t e = 0; e < entries; ++e) {
    amax[e] = e % 7 == 0 ? 0.0f : (e % 11 == 0 ? INFINITY : (e % 13 == 0 ? NAN : 0.001f * static_cast<float>(e * e)));
    max[e] = e % 3 == 2 ? 57344.0f : 448.0f;
  }
  const Tensor history = random_cpu({entries, length}, DType::f32, 31, 0.0, 2.0);
  const Tensor scale = random_cpu({entries}, DType::f32, 32, 1.0, 8.0);
  for (const auto compute : {raw::AmaxCompute::max, raw::AmaxCompute::most_recent}) {
    for (const double flag : {1.0, static_cast<double>(NAN)}) {
      std::vector<Tensor> state[2];
      for (int on_device = 0; on_device < 2; ++on_device) {
        const auto place = [&](const Tensor& t) { return on_device ? on_gpu(t) : raw::clone(t); };
        state[on_device] = {place(history), place(from_vector(amax, {entries})), place(scale),
                            place(from_vector(max, {entries})), place(full({}, 5.0))};
        const std::vector<Tensor>& s = state[on_device];
        raw::fp8_update_scales(s[0], s[1], s[2], s[3], 2, compute, place(full({1}, flag, {.dtype = DType::f64})), s[4]);
      }
      const float clipped = on_cpu(state[1][4]).to_vector<float>()[0];
      EXPECT_EQ(clipped, state[0][4].to_vector<float>()[0]) << "flag " << flag;
      if (flag == 1.0) EXPECT_GT(clipped, 5.0f);  // the test's amaxes do clip some entries
      for (size_t i = 0; i < 3; ++i) {
        EXPECT_TRUE(testing::all_close(on_cpu(state[1][i]), state[0][i], 0, 0)) << "tensor " << i << " flag " << flag;
      }
    }
  }
}

}  // namespace
}  // namespace cpf
