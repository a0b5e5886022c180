// The multi-tensor optimizer kernels against the measured device-to-device copy: the fused AdamW step
// and the global sum of squares (gradient norm), over the parameter tensors of a 124M-parameter GPT-2
// small (vocab 50257, 1024 positions, 12 layers of width 768: the tensor sizes of a real model, from
// 768-element biases to the 38.6M-element embedding). Both go through the device kernel table as
// optim::AdamW::step and optim::grad_norm do, one launch for all tensors (plus the table upload).
//
//   gpu_optim_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
//
// GB/s = (bytes read + bytes written) / time, each array once: AdamW f32 reads param, grad, exp_avg,
// exp_avg_sq and writes param, exp_avg, exp_avg_sq (28 bytes per parameter); with bf16 parameters and
// gradients (f32 state) 22 bytes. The sum of squares reads each gradient once.
#include <cstdio>
#include <vector>

#include "benchmarks/gpu/gpu_bench_util.h"
#include "framework/tensor/device_ops.h"
#include "framework/tensor/storage.h"

namespace {

using namespace cpf;

// The parameter shapes of GPT-2 small (124,439,808 parameters).
std::vector<Shape> gpt2_small_shapes() {
  const int64_t vocab = 50257, positions = 1024, width = 768, layers = 12;
  std::vector<Shape> shapes{{vocab, width}, {positions, width}};
  for (int64_t l = 0; l < layers; ++l) {
    for (const Shape& s : std::vector<Shape>{{width},  // ln_1 weight, bias
                                             {width},
                                             {width, 3 * width},  // attention qkv
                                             {3 * width},
                                             {width, width},  // attention output
                                             {width},
                                             {width},  // ln_2 weight, bias
                                             {width},
                                             {width, 4 * width},  // mlp in
                                             {4 * width},
                                             {4 * width, width},  // mlp out
                                             {width}}) {
      shapes.push_back(s);
    }
  }
  shapes.push_back({width});  // ln_f
  shapes.push_back({width});
  return shapes;
}

struct ModelState {
  std::vector<DeviceAdamWParam> params;
  std::vector<Tensor> grads;
  int64_t numel = 0;
};

ModelState make_state(DType dtype) {
  ModelState m;
  const DType state_dtype = dtype == DType::f64 ? DType::f64 : DType::f32;
  uint64_t seed = 1;
  for (const Shape& s : gpt2_small_shapes()) {
    DeviceAdamWParam p;
    p.param = bench::gpu_random(s, dtype, seed++);
    p.grad = bench::gpu_random(s, dtype, seed++);
    p.exp_avg = zeros(s, {.dtype = state_dtype, .device = Device::cuda()});
    p.exp_avg_sq = zeros(s, {.dtype = state_dtype, .device = Device::cuda()});
    p.weight_decay = s.size() == 2 ? 0.1 : 0.0;  // decay on matrices only, as GPT-2 training does
    m.numel += p.param.numel();
    m.grads.push_back(p.grad);
    m.params.push_back(std::move(p));
  }
  return m;
}

DType dtype_arg(benchmark::State& state) { return state.range(0) == 0 ? DType::f32 : DType::bf16; }

void BM_memcpy_d2d(benchmark::State& state) {
  const int64_t n = int64_t(1) << 26;
  bench::time_copy_roof(state, n);
}

void BM_adamw_step(benchmark::State& state) {
  const DType dtype = dtype_arg(state);
  ModelState m = make_state(dtype);
  const auto step = device_kernel(Device::cuda(), &DeviceOps::adamw_step, "gpu_optim_bench");
  DeviceAdamW hyper{.lr = 6e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .step = 1};
  bench::time_device(state, [&] {
    step(m.params, hyper);
    ++hyper.step;
  });
  const double per_param = dtype == DType::f32 ? 28.0 : 22.0;
  bench::set_bytes(state, per_param * static_cast<double>(m.numel));
  state.counters["params"] = static_cast<double>(m.numel);
}

void BM_grad_norm(benchmark::State& state) {
  const DType dtype = dtype_arg(state);
  ModelState m = make_state(dtype);
  Tensor out = empty({1}, {.dtype = DType::f64, .device = Device::cuda()});
  const auto sum_squares = device_kernel(Device::cuda(), &DeviceOps::sum_squares, "gpu_optim_bench");
  bench::time_device(state, [&] { sum_squares(out, m.grads); });
  bench::set_bytes(state, static_cast<double>(dtype_size(dtype)) * static_cast<double>(m.numel));
}

BENCHMARK(BM_memcpy_d2d)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_adamw_step)->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_grad_norm)->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) {
  return cpf::bench::run_bandwidth_benchmarks(argc, argv, "gpu_optim_bench", "BM_memcpy_d2d/manual_time",
                                              "kernel (median), /0 f32, /1 bf16");
}
