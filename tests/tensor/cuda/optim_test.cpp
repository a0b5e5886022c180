// The optimizer's device paths against the CPU optimizer: the fused multi-tensor AdamW step (one launch
// per parameter dtype) over several steps, and the global gradient norm (one sum-of-squares launch).
#include <cstdio>
#include <cstring>

#include "cuda_test_utils.h"
#include "framework/optim/adamw.h"
#include "framework/optim/grad_clip.h"
#include "framework/tensor/ops/views.h"

namespace cpf {
namespace {

using testing::all_close;
using testing::on_cpu;
using testing::on_gpu;
using testing::random_cpu;

class CudaOptimTest : public testing::CudaTest {};

int64_t bit_mismatches(const Tensor& a, const Tensor& b) {
  const auto x = a.to_vector<double>(), y = b.to_vector<double>();
  int64_t n = 0;
  for (size_t i = 0; i < x.size(); ++i) n += std::memcmp(&x[i], &y[i], sizeof(double)) != 0;
  return n;
}

TEST_F(CudaOptimTest, FusedAdamWMatchesTheCpuOptimizerOverSeveralSteps) {
  // A matrix (decayed), a bias and a norm gain (not decayed), one tensor of several chunks, a scalar.
  const std::vector<std::pair<std::string, Shape>> specs{
      {"proj.weight", {64, 33}}, {"proj.bias", {33}}, {"norm.weight", {33}}, {"big.weight", {5000, 7}}, {"s", {1}}};
  for (DType dtype : {DType::f32, DType::f64, DType::bf16}) {
    optim::NamedTensors cpu_params, gpu_params;
    uint64_t seed = 10;
    for (const auto& [name, shape] : specs) {
      Tensor p = random_cpu(shape, dtype, seed++);
      cpu_params.emplace_back(name, raw::to(p, dtype).set_requires_grad(true));
      gpu_params.emplace_back(name, on_gpu(p).set_requires_grad(true));
    }
    const optim::AdamWOptions options{.lr = 3e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    optim::AdamW cpu_opt(cpu_params, options), gpu_opt(gpu_params, options);
    for (int step = 1; step <= 6; ++step) {
      for (size_t i = 0; i < specs.size(); ++i) {
        if (step == 3 && i == 1) {  // no gradient this step: skipped on both sides, decay included
          cpu_params[i].second.set_grad(Tensor());
          gpu_params[i].second.set_grad(Tensor());
          continue;
        }
        Tensor g = random_cpu(specs[i].second, dtype, 1000 * step + i, -2.0, 2.0);
        cpu_params[i].second.set_grad(g);
        gpu_params[i].second.set_grad(on_gpu(g));
      }
      if (step == 4) {  // a learning-rate change between steps
        cpu_opt.set_lr(1e-2);
        gpu_opt.set_lr(1e-2);
      }
      cpu_opt.step();
      gpu_opt.step();
    }
    EXPECT_EQ(gpu_opt.step_count(), 6);
    // Both sides round every operation alike (device_ops.h): f32/f64 are expected bit-identical and
    // checked tightly. bf16 parameters: the same f32 update rounded once to bf16, so a last-bit f32
    // difference could at most flip one bf16 rounding (one step, 2^-8 relative).
    const double rtol = dtype == DType::bf16 ? 1.0 / 128 : dtype == DType::f32 ? 1e-6 : 1e-14;
    const double atol = dtype == DType::f64 ? 1e-15 : 1e-7;
    int64_t mismatched = 0;
    for (size_t i = 0; i < specs.size(); ++i) {
      const Tensor gp = on_cpu(gpu_params[i].second);
      EXPECT_EQ(gpu_params[i].second.device(), Device::cuda(0));
      EXPECT_TRUE(all_close(gp, cpu_params[i].second, atol, rtol)) << dtype_name(dtype) << " " << specs[i].first;
      mismatched += bit_mismatches(gp, cpu_params[i].second);
    }
    const optim::NamedTensors cpu_state = cpu_opt.state_tensors(), gpu_state = gpu_opt.state_tensors();
    ASSERT_EQ(cpu_state.size(), gpu_state.size());
    for (size_t i = 0; i < cpu_state.size(); ++i) {
      const Tensor gs = on_cpu(gpu_state[i].second);
      EXPECT_EQ(gs.dtype(), optim::state_dtype(dtype));
      EXPECT_TRUE(all_close(gs, cpu_state[i].second, atol, dtype == DType::f64 ? 1e-14 : 1e-6))
          << dtype_name(dtype) << " " << cpu_state[i].first;
      mismatched += bit_mismatches(gs, cpu_state[i].second);
    }
    std::printf("adamw %s: %lld elements of parameters and state not bit-identical to the CPU\n",
                dtype_name(dtype).c_str(), static_cast<long long>(mismatched));
  }
}

TEST_F(CudaOptimTest, GradNormAndClippingMatchTheCpu) {
  const std::vector<Shape> shapes{{300, 41}, {41}, {9000}, {0, 5}, {2, 3}};
  for (DType dtype : {DType::f32, DType::bf16, DType::f64}) {
    std::vector<Tensor> cpu_params, gpu_params;
    for (size_t i = 0; i < shapes.size(); ++i) {
      Tensor p = random_cpu(shapes[i], dtype, 50 + i);
      cpu_params.push_back(raw::to(p, dtype).set_requires_grad(true));
      gpu_params.push_back(on_gpu(p).set_requires_grad(true));
      if (i == 4) continue;  // no gradient: skipped
      Tensor g = random_cpu(shapes[i], dtype, 60 + i, -3.0, 3.0);
      cpu_params.back().set_grad(g);
      gpu_params.back().set_grad(on_gpu(g));
    }
    // A non-contiguous gradient (a transposed view) is made contiguous for the kernel.
    Tensor t = random_cpu({17, 23}, dtype, 70);
    cpu_params.push_back(random_cpu({23, 17}, dtype, 71).set_requires_grad(true));
    gpu_params.push_back(on_gpu(cpu_params.back()).set_requires_grad(true));
    cpu_params.back().set_grad(raw::transpose(t, 0, 1));
    gpu_params.back().set_grad(raw::transpose(on_gpu(t), 0, 1));

    const double expected = optim::grad_norm(cpu_params);
    EXPECT_NEAR(optim::grad_norm(gpu_params), expected, 1e-12 * expected) << dtype_name(dtype);
    // Clipping scales every gradient by the same factor on both sides.
    EXPECT_NEAR(optim::clip_grad_norm_(gpu_params, 1.0), optim::clip_grad_norm_(cpu_params, 1.0), 1e-12 * expected);
    for (size_t i = 0; i < cpu_params.size(); ++i) {
      if (!cpu_params[i].grad().defined()) continue;
      EXPECT_TRUE(
          all_close(on_cpu(gpu_params[i].grad()), cpu_params[i].grad(), 1e-7, std::max(testing::rtol_for(dtype), 1e-6)))
          << dtype_name(dtype) << " gradient " << i;
    }
    // After clipping to 1: bf16 gradients were rounded once more by the scaling (2^-8 relative).
    EXPECT_NEAR(optim::grad_norm(gpu_params), 1.0, std::max(testing::rtol_for(dtype), 1e-5)) << dtype_name(dtype);
  }
  // Mixed devices: the CPU gradients and the GPU ones add up.
  Tensor a = random_cpu({100}, DType::f32, 80).set_requires_grad(true);
  Tensor b = on_gpu(random_cpu({100}, DType::f32, 81)).set_requires_grad(true);
  a.set_grad(random_cpu({100}, DType::f32, 82));
  b.set_grad(on_gpu(random_cpu({100}, DType::f32, 83)));
  const double na = optim::grad_norm(std::vector<Tensor>{a}), nb = optim::grad_norm(std::vector<Tensor>{b});
  EXPECT_NEAR(optim::grad_norm(std::vector<Tensor>{a, b}), std::sqrt(na * na + nb * nb), 1e-12 * (na + nb));
}

}  // namespace
}  // namespace cpf
