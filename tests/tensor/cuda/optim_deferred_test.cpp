// Optimizer::step_deferred on a GPU (docs/optim.md, "Deferred steps"): AdamW picks t from its device count
// of applied steps, with the candidate bias corrections computed on the host. Against today's path
// (step(skip) + commit after reading each step's sum back) bit for bit over steps with non-finite ones
// inside a window, across settles of every size, a load_state and an abandon; no host synchronisation
// while a window is enqueued.
#include <algorithm>
#include <cmath>

#include "cuda_test_utils.h"
#include "framework/optim/adamw.h"
#include "framework/optim/grad_clip.h"
#include "framework/tensor/cuda/host_readback.h"
#include "framework/tensor/ops/copy.h"

namespace cpf {
namespace {

using testing::on_gpu;
using testing::random_cpu;

class CudaOptimDeferredTest : public testing::CudaTest {};

optim::NamedTensors make_params(DType dtype) {
  const std::vector<std::pair<std::string, Shape>> specs{
      {"proj.weight", {64, 33}}, {"norm.weight", {33}}, {"big", {9000}}};
  optim::NamedTensors params;
  for (size_t i = 0; i < specs.size(); ++i) {
    Tensor p = on_gpu(random_cpu(specs[i].second, dtype, 10 + i));
    params.emplace_back(specs[i].first, p.set_requires_grad(true));
  }
  return params;
}

// Steps 3, 4 and 9 hold a NaN or an inf: two skipped in a row inside a window, one at a window's end.
bool poisoned(int step) { return step == 3 || step == 4 || step == 9; }

void set_grads(const optim::NamedTensors& params, int step) {
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i].second;
    Tensor g = random_cpu(p.shape(), p.dtype(), 1000 * step + i, -2.0, 2.0);
    if (poisoned(step) && i == 2) g = full(p.shape(), step == 4 ? INFINITY : NAN, {.dtype = p.dtype()});
    p.set_grad(on_gpu(g));
  }
}

std::vector<std::vector<double>> all_values(const optim::NamedTensors& params, const optim::Optimizer& opt) {
  std::vector<std::vector<double>> out;
  for (const auto& [name, t] : params) out.push_back(t.to_vector<double>());
  for (const auto& [name, t] : opt.state_tensors()) out.push_back(t.to_vector<double>());
  return out;
}

const optim::AdamWOptions kOptions{.lr = 3e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};

// Twelve steps with a per-step lr; the deferred run settles after the steps in `settle_after`.
void expect_same_as_committed_steps(DType dtype, const std::vector<int>& settle_after) {
  const optim::NamedTensors ref_params = make_params(dtype), params = make_params(dtype);
  optim::AdamW ref(ref_params, kOptions), opt(params, kOptions);
  std::vector<Tensor> sums;
  for (int step = 1; step <= 12; ++step) {
    ref.set_lr(1e-2 * step);
    opt.set_lr(1e-2 * step);
    set_grads(ref_params, step);
    set_grads(params, step);
    const Tensor ref_sum = optim::grad_sum_squares(ref_params);
    ref.step(ref_sum);
    ref.commit(std::isfinite(std::sqrt(ref_sum.item<double>())));
    sums.push_back(optim::grad_sum_squares(params));
    opt.step_deferred(sums.back());
    if (std::find(settle_after.begin(), settle_after.end(), step) == settle_after.end() && step < 12) continue;
    std::vector<bool> applied;
    for (const Tensor& s : sums) applied.push_back(std::isfinite(std::sqrt(s.item<double>())));
    for (size_t i = 0; i < applied.size(); ++i)
      EXPECT_EQ(applied[i], !poisoned(step - int(applied.size()) + 1 + int(i)));
    opt.settle(applied);
    sums.clear();
    EXPECT_EQ(opt.step_count(), ref.step_count()) << dtype_name(dtype) << " step " << step;
    EXPECT_EQ(all_values(params, opt), all_values(ref_params, ref)) << dtype_name(dtype) << " step " << step;
  }
  EXPECT_EQ(opt.step_count(), 9);
}

TEST_F(CudaOptimDeferredTest, DeviceCountedStepsEqualTheCommittedStepsBitForBit) {
  for (DType dtype : {DType::f32, DType::bf16, DType::f64}) {
    expect_same_as_committed_steps(dtype, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});  // one step per window
    expect_same_as_committed_steps(dtype, {5, 10});  // skipped steps inside a window and at its end
    expect_same_as_committed_steps(dtype, {});       // all twelve in flight at once
  }
}

TEST_F(CudaOptimDeferredTest, TheCountIsResetFromTheHostAfterLoadStateAndAbandon) {
  const optim::NamedTensors ref_params = make_params(DType::f32), params = make_params(DType::f32);
  optim::AdamW ref(ref_params, kOptions), opt(params, kOptions);
  // Two deferred steps abandoned (their outcome unknown to the host), then a load_state of the reference
  // at step count 5: the next deferred step must use t = 6 whatever the device counted before.
  for (int step = 1; step <= 2; ++step) {
    set_grads(params, step);
    opt.step_deferred(optim::grad_sum_squares(params));
  }
  opt.abandon();
  for (int step = 1; step <= 5; ++step) {
    set_grads(ref_params, step + 4);  // steps 5..9 of the schedule: 9 is skipped
    if (std::isfinite(optim::grad_norm(ref_params))) ref.step();
  }
  ASSERT_EQ(ref.step_count(), 4);
  for (size_t i = 0; i < params.size(); ++i) raw::copy_(params[i].second, ref_params[i].second);
  opt.load_state(ref.state_tensors(), ref.step_count());
  for (int step = 10; step <= 12; ++step) {
    set_grads(ref_params, step);
    set_grads(params, step);
    ref.step();
    opt.step_deferred(optim::grad_sum_squares(params));
  }
  opt.settle({true, true, true});
  EXPECT_EQ(opt.step_count(), 7);
  EXPECT_EQ(all_values(params, opt), all_values(ref_params, ref));
}

TEST_F(CudaOptimDeferredTest, AWindowIsEnqueuedWithoutAHostSync) {
  const optim::NamedTensors params = make_params(DType::f32);
  optim::AdamW opt(params, kOptions);
  for (int warm = 10; warm <= 13; ++warm) {  // the allocator's cache (a window as long) and the count tensor
    set_grads(params, warm);
    const Tensor sum = optim::grad_sum_squares(params);
    optim::clip_grads_by_sum_squares_(params, sum, 1.0);
    opt.step_deferred(sum);
  }
  opt.settle({true, true, true, true});
  std::vector<Tensor> grads;
  for (int step = 5; step <= 8; ++step) {  // the gradients made first: their uploads are not the optimizer's
    set_grads(params, step);
    for (const auto& [name, p] : params) grads.push_back(p.grad());
  }
  const cuda::HostSyncCounts before = cuda::host_sync_counts();
  for (int i = 0; i < 4; ++i) {
    for (size_t j = 0; j < params.size(); ++j) params[j].second.set_grad(grads[i * params.size() + j]);
    const Tensor sum = optim::grad_sum_squares(params);
    optim::clip_grads_by_sum_squares_(params, sum, 1.0);
    opt.step_deferred(sum);
  }
  const cuda::HostSyncCounts enqueued = cuda::host_sync_counts() - before;
  EXPECT_EQ(enqueued.total(), 0u) << cuda::to_string(enqueued);
  EXPECT_EQ(opt.deferred_in_flight(), 4);
  opt.settle({true, true, true, true});
  EXPECT_EQ(opt.step_count(), 8);
}

}  // namespace
}  // namespace cpf
