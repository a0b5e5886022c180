// The optimizer phase decided on the device (docs/training.md, "Host synchronisation in a step"): the clip
// kernel against the host-decided clip (raw::mul_ per gradient after reading the norm back) and against
// the CPU, AdamW with its skip read from the device sum against the host-decided step (bit for bit) and
// the CPU, no host synchronisation while the phase is enqueued, and HostReadback's one event wait.
#include <cstring>

#include "cuda_test_utils.h"
#include "framework/optim/adamw.h"
#include "framework/optim/grad_clip.h"
#include "framework/tensor/cuda/host_readback.h"
#include "framework/tensor/ops/views.h"

namespace cpf {
namespace {

using testing::all_close;
using testing::on_cpu;
using testing::on_gpu;
using testing::random_cpu;

class CudaOptimDecisionTest : public testing::CudaTest {};

// Bit patterns of every gradient (as f64, exact for every floating dtype).
std::vector<std::vector<double>> grad_values(const std::vector<Tensor>& params) {
  std::vector<std::vector<double>> out;
  for (const Tensor& p : params)
    out.push_back(p.grad().defined() ? p.grad().to_vector<double>() : std::vector<double>{});
  return out;
}

// Parameters on `device` with gradients scaled by `scale`: several chunks, odd sizes (the scalar tail),
// one unaligned gradient (a view at offset 1: the kernel's non-vector path), one without a gradient.
std::vector<Tensor> clip_params(DType dtype, Device device, double scale) {
  const std::vector<Shape> shapes{{300, 41}, {41}, {20001}, {3}, {2, 3}};
  std::vector<Tensor> params;
  for (size_t i = 0; i < shapes.size(); ++i) {
    Tensor p = raw::to(random_cpu(shapes[i], dtype, 50 + i), device);
    p.set_requires_grad(true);
    params.push_back(p);
    if (i == 4) continue;  // no gradient
    Tensor g = random_cpu(shapes[i], DType::f64, 60 + i, -scale, scale);
    if (i == 3) {  // unaligned: elements 1..3 of a 4-element tensor
      p.set_grad(raw::narrow(raw::to(raw::to(random_cpu({4}, DType::f64, 99, -scale, scale), dtype), device), 0, 1, 3));
    } else {
      p.set_grad(raw::to(raw::to(g, dtype), device));
    }
  }
  return params;
}

TEST_F(CudaOptimDecisionTest, ClipKernelEqualsTheHostDecidedClipBitForBit) {
  for (DType dtype : {DType::f32, DType::bf16, DType::f64}) {
    for (double max_norm : {1.0, 1e9}) {  // clipped; left alone (norm below max_norm)
      const Device gpu = Device::cuda(0);
      const std::vector<Tensor> host_decided = clip_params(dtype, gpu, 3.0), kernel = clip_params(dtype, gpu, 3.0);
      const std::vector<Tensor> cpu = clip_params(dtype, Device::cpu(), 3.0);
      const double norm = optim::clip_grad_norm_(host_decided, max_norm);
      optim::clip_grad_norm_(cpu, max_norm);
      const Tensor sum = optim::grad_sum_squares(kernel);
      EXPECT_EQ(std::sqrt(sum.item<double>()), norm) << dtype_name(dtype);
      optim::clip_grads_by_sum_squares_(kernel, sum, max_norm);
      EXPECT_EQ(grad_values(kernel), grad_values(host_decided)) << dtype_name(dtype) << " max_norm " << max_norm;
      for (size_t i = 0; i < cpu.size(); ++i) {
        if (!cpu[i].grad().defined()) continue;
        EXPECT_TRUE(all_close(on_cpu(kernel[i].grad()), cpu[i].grad(), 1e-7, std::max(testing::rtol_for(dtype), 1e-6)))
            << dtype_name(dtype) << " gradient " << i;
      }
    }
  }
}

TEST_F(CudaOptimDecisionTest, ClipKernelLeavesGradientsAloneForANonFiniteSum) {
  for (double bad : {double(INFINITY), double(NAN)}) {
    const std::vector<Tensor> params = clip_params(DType::f32, Device::cuda(0), 3.0);
    const auto before = grad_values(params);
    optim::clip_grads_by_sum_squares_(params, on_gpu(full({1}, bad, {.dtype = DType::f64})), 1.0);
    EXPECT_EQ(grad_values(params), before);
  }
}

optim::NamedTensors adamw_params(DType dtype, Device device) {
  const std::vector<std::pair<std::string, Shape>> specs{
      {"proj.weight", {64, 33}}, {"norm.weight", {33}}, {"big", {9000}}};
  optim::NamedTensors params;
  for (size_t i = 0; i < specs.size(); ++i) {
    Tensor p = raw::to(random_cpu(specs[i].second, dtype, 10 + i), device);
    params.emplace_back(specs[i].first, p.set_requires_grad(true));
  }
  return params;
}

// Gradients of step `step`; step 3 holds a NaN, so its norm is not finite.
void set_adamw_grads(const optim::NamedTensors& params, int step) {
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i].second;
    Tensor g = random_cpu(p.shape(), p.dtype(), 1000 * step + i, -2.0, 2.0);
    if (step == 3 && i == 2) g = full(p.shape(), NAN, {.dtype = p.dtype()});
    p.set_grad(raw::to(g, p.device()));
  }
}

std::vector<std::vector<double>> all_values(const optim::NamedTensors& params, const optim::Optimizer& opt) {
  std::vector<std::vector<double>> out;
  for (const auto& [name, t] : params) out.push_back(t.to_vector<double>());
  for (const auto& [name, t] : opt.state_tensors()) out.push_back(t.to_vector<double>());
  return out;
}

TEST_F(CudaOptimDecisionTest, AdamWSkipOnTheDeviceEqualsTheHostDecidedStep) {
  const optim::AdamWOptions options{.lr = 3e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  for (DType dtype : {DType::f32, DType::bf16, DType::f64}) {
    const optim::NamedTensors host_params = adamw_params(dtype, Device::cuda(0));
    const optim::NamedTensors device_params = adamw_params(dtype, Device::cuda(0));
    const optim::NamedTensors cpu_params = adamw_params(dtype, Device::cpu());
    optim::AdamW host(host_params, options), device(device_params, options), cpu(cpu_params, options);
    for (int step = 1; step <= 5; ++step) {
      set_adamw_grads(host_params, step);
      set_adamw_grads(device_params, step);
      set_adamw_grads(cpu_params, step);
      if (std::isfinite(optim::grad_norm(host_params))) host.step();
      const Tensor sum = optim::grad_sum_squares(device_params);
      device.step(sum);  // decided by the kernel
      const bool applied = std::isfinite(std::sqrt(sum.item<double>()));
      EXPECT_EQ(applied, step != 3);
      device.commit(applied);
      const Tensor cpu_sum = optim::grad_sum_squares(cpu_params);
      cpu.step(cpu_sum);  // decided on the host: the reference
      cpu.commit(applied);
      EXPECT_EQ(device.step_count(), host.step_count());
      EXPECT_EQ(all_values(device_params, device), all_values(host_params, host))
          << dtype_name(dtype) << " step " << step;
    }
    EXPECT_EQ(device.step_count(), 4);
    // Against the CPU: the tolerances of optim_test.cpp's fused AdamW parity test.
    const double rtol = dtype == DType::bf16 ? 1.0 / 128 : dtype == DType::f32 ? 1e-6 : 1e-14;
    const double atol = dtype == DType::f64 ? 1e-15 : 1e-7;
    for (size_t i = 0; i < cpu_params.size(); ++i) {
      EXPECT_TRUE(all_close(on_cpu(device_params[i].second), cpu_params[i].second, atol, rtol))
          << dtype_name(dtype) << " " << cpu_params[i].first;
    }
  }
}

TEST_F(CudaOptimDecisionTest, TheOptimizerPhaseIsEnqueuedWithoutAHostSyncAndReadBackWithOneEventWait) {
  const optim::NamedTensors params = adamw_params(DType::f32, Device::cuda(0));
  optim::AdamW opt(params, optim::AdamWOptions{});
  cuda::HostReadback readback(0);
  const Tensor loss = on_gpu(full({}, 2.5, {.dtype = DType::f32}));
  for (int step : {1, 2, 4}) {  // finite gradients (step 3's hold a NaN); 1 and 2 warm the allocator's cache
    set_adamw_grads(params, step);
    const cuda::HostSyncCounts before = cuda::host_sync_counts();
    const Tensor sum = optim::grad_sum_squares(params);
    readback.enqueue({sum, loss});
    optim::clip_grads_by_sum_squares_(params, sum, 1.0);
    opt.step(sum);
    const cuda::HostSyncCounts enqueued = cuda::host_sync_counts() - before;
    const std::vector<double> read = readback.wait();
    const cuda::HostSyncCounts waited = cuda::host_sync_counts() - before;
    opt.commit(std::isfinite(std::sqrt(read[0])));
    if (step != 4) continue;
    EXPECT_EQ(enqueued.total(), 0u) << cuda::to_string(enqueued);
    EXPECT_EQ(waited.stream_syncs, 1u) << cuda::to_string(waited);
    EXPECT_EQ(waited.total(), 1u) << cuda::to_string(waited);
    EXPECT_EQ(read[1], 2.5);
    EXPECT_GT(read[0], 1.0);                           // the sum before clipping: norm > 1
    EXPECT_NEAR(optim::grad_norm(params), 1.0, 1e-5);  // clipped to 1 by the kernel
    EXPECT_EQ(opt.step_count(), 3);
  }
}

TEST_F(CudaOptimDecisionTest, HostReadbackReadsEveryFloatingDtypeAsItemDoes) {
  cuda::HostReadback readback(0);
  const Tensor a = on_gpu(full({1}, 1.0 / 3.0, {.dtype = DType::f64}));
  const Tensor b = on_gpu(full({}, 1.0 / 3.0, {.dtype = DType::f32}));
  const Tensor c = on_gpu(full({1, 1}, -1.0 / 3.0, {.dtype = DType::bf16}));
  readback.enqueue({a, b, c});
  EXPECT_TRUE(readback.pending());
  const std::vector<double> v = readback.wait();
  EXPECT_FALSE(readback.pending());
  EXPECT_EQ(v, (std::vector<double>{a.item<double>(), b.item<double>(), c.item<double>()}));
}

TEST_F(CudaOptimDecisionTest, HostReadbackRejectsMisuse) {
  cuda::HostReadback readback(0);
  const Tensor x = on_gpu(full({1}, 1.0, {.dtype = DType::f64}));
  EXPECT_CPF_ERROR(readback.wait(), "HostReadback::wait: nothing was enqueued since the last wait");
  EXPECT_CPF_ERROR(readback.enqueue({}), "HostReadback::enqueue: takes 1 to 8 values, got 0");
  EXPECT_CPF_ERROR(readback.enqueue(std::vector<Tensor>(9, x)), "takes 1 to 8 values, got 9");
  EXPECT_CPF_ERROR(readback.enqueue({x, Tensor()}), "HostReadback::enqueue: value 1 is an undefined tensor");
  EXPECT_CPF_ERROR(readback.enqueue({full({1}, 1.0)}),
                   "HostReadback::enqueue: value 0 is on cpu but this readback is for cuda:0");
  EXPECT_CPF_ERROR(readback.enqueue({on_gpu(zeros({2}))}),
                   "HostReadback::enqueue: value 0 must have one element, got shape [2]");
  EXPECT_CPF_ERROR(readback.enqueue({on_gpu(zeros({1}, {.dtype = DType::i64}))}),
                   "HostReadback::enqueue: value 0 has dtype i64; only f32, f64 and bf16 values are read back");
  EXPECT_FALSE(readback.pending());
  readback.enqueue({x});
  EXPECT_CPF_ERROR(readback.enqueue({x}), "HostReadback::enqueue: the previous values were not waited for");
  EXPECT_EQ(readback.wait(), std::vector<double>{1.0});
}

}  // namespace
}  // namespace cpf
