// The FP8 casts fused into an activation on the GPU (framework/tensor/cuda/fp8.cu's GeluLoad and SwigluLoad,
// framework/tensor/ops/fp8_activation.h): against the unfused GPU path (the element-wise activation kernel,
// then abs_max and the transposing cast) bit for bit, since both read activation_math.cuh's formulas; against
// the CPU within one FP8 code where the two sides' exp rounds h to another bf16 value; and fp8_linear_after's
// forward and gradients equal the unfused FP8 layer's exactly (the same GEMM operands and activation kernels).
#include "framework/tensor/ops/fp8_activation.h"

#include <cstdlib>
#include <vector>

#include "cuda_test_utils.h"
#include "framework/autograd/engine.h"
#include "framework/autograd/functions/elementwise.h"
#include "framework/autograd/functions/fp8_linear.h"
#include "framework/autograd/functions/swiglu.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/views.h"

namespace cpf {
namespace {

using raw::CastActivation;
using testing::on_cpu;
using testing::on_gpu;
using testing::random_cpu;

class CudaFp8ActivationTest : public testing::CudaTest {};

// pre (rows, width) bf16 on the CPU: uniform values, with a few large ones that saturate E4M3 at a margin.
Tensor pre_values(int64_t rows, int64_t width, uint64_t seed) {
  std::vector<float> v = random_cpu({rows, width}, DType::f32, seed, -4.0, 4.0).to_vector<float>();
  for (size_t i = 0; i < v.size(); i += 97) v[i] *= 40.0f;
  return raw::to(from_vector(v, {rows, width}), DType::bf16);
}

// Count of codes that differ, and whether every difference is one code step (same sign and format).
std::pair<int64_t, bool> code_differences(const Tensor& a, const Tensor& b) {
  const Tensor ac = raw::contiguous(on_cpu(a)), bc = raw::contiguous(on_cpu(b));
  const auto* pa = static_cast<const uint8_t*>(ac.raw_data());
  const auto* pb = static_cast<const uint8_t*>(bc.raw_data());
  int64_t n = 0;
  bool adjacent = true;
  for (int64_t i = 0; i < ac.numel(); ++i) {
    if (pa[i] == pb[i]) continue;
    ++n;
    adjacent = adjacent && (pa[i] & 0x80) == (pb[i] & 0x80) && std::abs(int(pa[i] & 0x7f) - int(pb[i] & 0x7f)) == 1;
  }
  return {n, adjacent};
}

Tensor scalar_on(float v, Device device) { return raw::to(from_vector(std::vector<float>{v}, {}), device); }

// Whole 64 x 64 tiles (the fused kernels) and a shape they do not take (the unfused fallback).
TEST_F(CudaFp8ActivationTest, FusedCastsEqualTheUnfusedGpuPathBitForBit) {
  for (CastActivation act : {CastActivation::gelu, CastActivation::swiglu}) {
    for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{128, 192}, {48, 80}}) {
      const int64_t width = act == CastActivation::swiglu ? 2 * cols : cols;
      const Tensor pre = on_gpu(pre_values(rows, width, 7 + rows));
      const Tensor h = raw::apply_cast_activation(pre, act);  // the unfused path: (rows, cols) bf16
      const Tensor amax = raw::activation_abs_max(pre, act);
      const std::string what = std::string(raw::cast_activation_name(act)) + " " + std::to_string(rows);
      ASSERT_EQ(on_cpu(amax).item<float>(), on_cpu(raw::abs_max(h)).item<float>()) << what;
      for (DType fp8 : {DType::f8e4m3, DType::f8e5m2}) {
        const Tensor scale = raw::fp8_scale(amax, fp8, 2);  // margin 2: the large values saturate
        const Tensor running = scalar_on(0.5f, pre.device()), running_ref = scalar_on(0.5f, pre.device());
        const raw::Fp8Transposed fused = raw::quantize_activation_fp8_transposed(pre, act, scale, fp8, running);
        const raw::Fp8Transposed ref = raw::quantize_fp8_transposed(h, scale, fp8, running_ref);
        EXPECT_EQ(code_differences(fused.q, ref.q).first, 0) << what;
        EXPECT_EQ(code_differences(fused.qt, ref.qt).first, 0) << what;
        EXPECT_EQ(on_cpu(running).item<float>(), on_cpu(running_ref).item<float>()) << what;
      }
    }
  }
}

// The GPU against the CPU reference with one scale: h's bf16 values agree except where CUDA's exp and the
// CPU's round f32 across a bf16 boundary, which moves a code by at most one step.
TEST_F(CudaFp8ActivationTest, FusedCastsStayWithinOneCodeOfTheCpu) {
  for (CastActivation act : {CastActivation::gelu, CastActivation::swiglu}) {
    const Tensor pre = pre_values(256, act == CastActivation::swiglu ? 512 : 256, 11);
    const float amax_cpu = raw::activation_abs_max(pre, act).item<float>();
    const float amax_gpu = on_cpu(raw::activation_abs_max(on_gpu(pre), act)).item<float>();
    EXPECT_NEAR(amax_gpu, amax_cpu, amax_cpu / 128) << raw::cast_activation_name(act);
    const Tensor scale = scalar_on(448.0f / amax_cpu, Device::cpu());
    const raw::Fp8Transposed cpu = raw::quantize_activation_fp8_transposed(pre, act, scale, DType::f8e4m3);
    const raw::Fp8Transposed gpu =
        raw::quantize_activation_fp8_transposed(on_gpu(pre), act, on_gpu(scale), DType::f8e4m3);
    const auto [differing, adjacent] = code_differences(gpu.q, cpu.q);
    EXPECT_LE(differing, cpu.q.numel() / 100) << raw::cast_activation_name(act);
    EXPECT_TRUE(adjacent) << raw::cast_activation_name(act);
    EXPECT_EQ(code_differences(raw::transpose(on_cpu(gpu.qt), 0, 1), gpu.q).first, 0);
  }
}

// fp8_linear_after against fp8_linear over the autograd activation on the GPU: identical GEMM operands,
// so the output and every gradient are equal, not merely close.
TEST_F(CudaFp8ActivationTest, LinearAfterActivationEqualsTheUnfusedLayer) {
  const int64_t m = 128, k = 192, n = 64;
  for (CastActivation act : {CastActivation::gelu, CastActivation::swiglu}) {
    const Tensor pre = on_gpu(pre_values(m, act == CastActivation::swiglu ? 2 * k : k, 13));
    const Tensor w = on_gpu(random_cpu({n, k}, DType::f32, 14, -0.1, 0.1));
    const Tensor b = on_gpu(random_cpu({n}, DType::f32, 15));
    const Tensor gy = on_gpu(random_cpu({m, n}, DType::bf16, 16));
    std::vector<Tensor> results[2];
    for (int fused = 0; fused < 2; ++fused) {
      Tensor p = pre.detach().set_requires_grad(true), wi = w.detach().set_requires_grad(true);
      Tensor bi = b.detach().set_requires_grad(true);
      const Tensor h = act == CastActivation::gelu ? gelu(p) : swiglu_packed(p);
      const Tensor y = fused ? fp8_linear_after(act, p, wi, bi, {}) : fp8_linear(h, wi, bi, {});
      backward(y, gy);
      for (const Tensor& t : {y, p.grad(), wi.grad(), bi.grad()}) results[fused].push_back(on_cpu(t));
    }
    const char* names[] = {"y", "d_pre", "dw", "db"};
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(testing::rel_error(results[1][i], results[0][i]), 0.0)
          << raw::cast_activation_name(act) << " " << names[i];
    }
  }
}

}  // namespace
}  // namespace cpf
