// cuDNN's FP8 attention forward and backward (attention/cuda/cudnn_fp8_forward.h, cudnn_fp8_backward.h) against
// the bf16 cuDNN ones of the same shape (raw::attention_forward / _backward with the backend forced to cuDNN):
// the measurement #32 asks for before FP8
// attention joins training (docs/fp8.md, "FP8 attention"). Shapes: the Llama-3.2-1B layer at 8192 tokens
// (32 query heads, 8 key/value heads, head dim 64, causal) and a head-dim-128 case.
//
//   gpu_fp8_attention_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
//
// TFLOP/s: forward = 2 b h s^2 (d_qk + d_v), halved when causal; backward 2.5 times that. A shape cuDNN has no
// FP8 engine for is reported as skipped with cuDNN's reason.
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "attention/attention_op.h"
#include "attention/cuda/cudnn_fp8_backward.h"
#include "attention/cuda/cudnn_fp8_forward.h"
#include "benchmarks/gpu/gpu_bench_util.h"
#include "framework/tensor/ops/fp8.h"

namespace {

using namespace cpf;

Tensor gpu_scalar(float v) { return raw::to(from_vector(std::vector<float>{v}, {}), Device::cuda(0)); }

struct Shape4 {
  int64_t b, h, h_kv, s, d;
};

// One benchmark case: range(0) the shape (0 the Llama-1B layer, 1 head dim 128), range(1) 0 bf16, 1 FP8;
// random bf16 q, k, v, dO, their FP8 codes (scale 1) and the forward's FP8 scales.
struct AttentionCase {
  explicit AttentionCase(const benchmark::State& state)
      : c(state.range(0) == 0 ? Shape4{1, 32, 8, 8192, 64} : Shape4{1, 16, 16, 8192, 128}),
        fp8(state.range(1) == 1),
        q(bench::gpu_random({c.b, c.s, c.h, c.d}, DType::bf16, 1)),
        k(bench::gpu_random({c.b, c.s, c.h_kv, c.d}, DType::bf16, 2)),
        v(bench::gpu_random({c.b, c.s, c.h_kv, c.d}, DType::bf16, 3)),
        dout(bench::gpu_random({c.b, c.s, c.h, c.d}, DType::bf16, 4)),
        one(gpu_scalar(1.0f)),
        q8(raw::quantize_fp8(q, one, DType::f8e4m3)),
        k8(raw::quantize_fp8(k, one, DType::f8e4m3)),
        v8(raw::quantize_fp8(v, one, DType::f8e4m3)),
        scales{one, one, one, gpu_scalar(448.0f), gpu_scalar(1.0f / 448.0f), one},
        softmax_scale(1.0 / std::sqrt(static_cast<double>(c.d))) {}
  // The forward's FLOPs: 2 b h s^2 (d_qk + d_v), halved for the causal mask.
  double forward_flops() const { return 2.0 * c.b * c.h * double(c.s) * double(c.s) * (2.0 * c.d) / 2.0; }

  Shape4 c;
  bool fp8;
  Tensor q, k, v, dout, one, q8, k8, v8;
  attention_cuda::Fp8AttentionScales scales;
  double softmax_scale;
  AttentionSpec spec{.qkv_format = QkvFormat::bshd, .mask = MaskType::causal};
};

void BM_attention_forward(benchmark::State& state) {
  const AttentionCase t(state);
  const auto run = [&] {
    if (t.fp8) {
      benchmark::DoNotOptimize(
          attention_cuda::cudnn_fp8_attention_forward(t.q8, t.k8, t.v8, t.scales, t.softmax_scale, true)
              .out.raw_data());
    } else {
      benchmark::DoNotOptimize(
          raw::attention_forward(t.q, t.k, t.v, t.spec, std::nullopt, {.backend = AttentionBackend::cudnn})
              .out.raw_data());
    }
  };
  try {
    run();  // the plan, once
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  bench::time_device(state, run);
  const double flops = t.forward_flops();
  state.counters["TFLOP/s"] =
      benchmark::Counter(flops * bench::kReps * 1e-12, benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(BM_attention_forward)
    ->ArgsProduct({{0, 1}, {0, 1}})
    ->ArgNames({"case", "fp8"})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// The backward of the same cases: bf16 from the bf16 forward's out and lse, FP8 from the FP8 forward's (dO
// in E5M2, the gradients in E5M2). Five matmuls against the forward's two: 2.5 times its FLOPs. On Hopper
// cuDNN has an FP8 backward for head dim 128 only, so case 0 in FP8 reports cuDNN's reason.
void BM_attention_backward(benchmark::State& state) {
  const AttentionCase t(state);
  std::function<void()> run;
  try {
    if (t.fp8) {
      const Tensor do8 = raw::quantize_fp8(t.dout, t.one, DType::f8e5m2);
      const attention_cuda::Fp8AttentionForward f =
          attention_cuda::cudnn_fp8_attention_forward(t.q8, t.k8, t.v8, t.scales, t.softmax_scale, true);
      const Tensor& one = t.one;
      const attention_cuda::Fp8AttentionBackwardScales bs{one, one, one, one, one, t.scales.scale_s, t.scales.descale_s,
                                                          one, one, one, one, one};
      run = [&t, do8, f, bs] {
        benchmark::DoNotOptimize(attention_cuda::cudnn_fp8_attention_backward(t.q8, t.k8, t.v8, f.out, do8, f.stats, bs,
                                                                              t.softmax_scale, true)
                                     .dq.raw_data());
      };
    } else {
      const raw::AttentionForward f =
          raw::attention_forward(t.q, t.k, t.v, t.spec, std::nullopt, {.backend = AttentionBackend::cudnn});
      run = [&t, f] {
        benchmark::DoNotOptimize(raw::attention_backward(t.dout, Tensor(), t.q, t.k, t.v, f.out, f.lse, t.spec,
                                                         std::nullopt, {.backend = AttentionBackend::cudnn})
                                     .dq.raw_data());
      };
    }
    run();  // the plan, once
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  bench::time_device(state, run);
  const double flops = 2.5 * t.forward_flops();
  state.counters["TFLOP/s"] =
      benchmark::Counter(flops * bench::kReps * 1e-12, benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(BM_attention_backward)
    ->ArgsProduct({{0, 1}, {0, 1}})
    ->ArgNames({"case", "fp8"})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (cpf::bench::no_device_to_measure("gpu_fp8_attention_bench")) return 0;
  cpf::bench::SummaryReporter reporter("TFLOP/s");
  benchmark::RunSpecifiedBenchmarks(&reporter);
  std::printf("\n%-52s %10s\n", "attention forward and backward, bf16 vs FP8 (median)", "TFLOP/s");
  for (const auto& [name, tflops] : reporter.values()) std::printf("%-52s %10.1f\n", name.c_str(), tflops);
  benchmark::Shutdown();
  return 0;
}
