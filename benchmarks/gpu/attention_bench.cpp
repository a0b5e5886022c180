// Attention on the GPU, bf16, through raw::attention_forward/backward with the backend forced to cuDNN
// (fused flash attention, attention/cuda/cudnn/fused_attention.h) or to the unfused path, against PyTorch 2.11's
// cuDNN SDPA on an H200 (docs/attention.md). Ends with the table
//   case | backend | fwd TFLOP/s | fwd+bwd TFLOP/s | ratio to peer
//
//   gpu_attention_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
//
// FLOPs (the peer's convention): forward = 2 b h s^2 (d_qk + d_v), halved when causal; forward +
// backward = 3.5 x forward. Time: CUDA events around `reps` back-to-back calls on the current stream,
// after a warm-up call (plan build, allocator cache). Inputs are uniform random, never zeros. The
// unfused path materialises (b, h, s, s) scores and may run out of memory at these sizes: such a run
// is reported as skipped with the error.
#include <cuda_runtime.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "attention/attention_op.h"
#include "attention/cuda/cudnn/fused_attention.h"
#include "benchmarks/gpu/gpu_bench_util.h"

namespace {

using namespace cpf;

struct AttentionCase {
  const char* key;   // in benchmark names
  const char* name;  // in the table
  int64_t b, h_q, h_kv, s, d_qk, d_v;
  bool causal;
  double peer_fwd, peer_fwd_bwd;  // PyTorch 2.11 cuDNN SDPA on an H200, TFLOP/s
};

const std::vector<AttentionCase>& cases() {
  static const std::vector<AttentionCase> all{
      {"causal", "causal b2 h16 s8192 d128", 2, 16, 16, 8192, 128, 128, true, 595, 503},
      {"non_causal", "non-causal b2 h16 s8192 d128", 2, 16, 16, 8192, 128, 128, false, 663, 541},
      {"gqa", "GQA 32q/8kv s16384 causal", 1, 32, 8, 16384, 128, 128, true, 588, 531},
      {"mla", "MLA 192/128 b2 h16 s8192 causal", 2, 16, 16, 8192, 192, 128, true, 559, 445},
  };
  return all;
}

double forward_flops(const AttentionCase& c) {
  const double f = 2.0 * c.b * c.h_q * static_cast<double>(c.s) * c.s * (c.d_qk + c.d_v);
  return c.causal ? f / 2 : f;
}

// "attention/<case key>/<backend>/<fwd or fwd+bwd>" (the arguments follow in the full run name).
std::string bench_name(int64_t i, int64_t backend, int64_t bwd) {
  return std::string("attention/") + cases()[static_cast<size_t>(i)].key + "/" + (backend == 0 ? "cudnn" : "unfused") +
         (bwd ? "/fwd+bwd" : "/fwd");
}

// Benchmark names -> why they were skipped (out of memory, backend cannot run the case).
std::map<std::string, std::string>& skipped() {
  static std::map<std::string, std::string> s;
  return s;
}

#define BENCH_CUDA_CHECK(call)                                                     \
  do {                                                                             \
    const cudaError_t status_ = (call);                                            \
    if (status_ != cudaSuccess) {                                                  \
      std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(status_)); \
      std::abort();                                                                \
    }                                                                              \
  } while (0)

// Times `reps` calls of fn per iteration with CUDA events on the current stream.
template <class Fn>
void time_with_events(benchmark::State& state, int reps, Fn&& fn) {
  cudaStream_t stream = static_cast<cudaStream_t>(cuda::current_stream(0).handle());
  cudaEvent_t start, stop;
  BENCH_CUDA_CHECK(cudaEventCreate(&start));
  BENCH_CUDA_CHECK(cudaEventCreate(&stop));
  fn();  // warm-up
  cuda::synchronize();
  for (auto _ : state) {
    BENCH_CUDA_CHECK(cudaEventRecord(start, stream));
    for (int r = 0; r < reps; ++r) fn();
    BENCH_CUDA_CHECK(cudaEventRecord(stop, stream));
    BENCH_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    BENCH_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    state.SetIterationTime(ms * 1e-3);
  }
  BENCH_CUDA_CHECK(cudaEventDestroy(start));
  BENCH_CUDA_CHECK(cudaEventDestroy(stop));
}

// Args: case index, backend (0 cudnn, 1 unfused), with backward (0/1).
void BM_attention(benchmark::State& state) {
  const AttentionCase& c = cases()[static_cast<size_t>(state.range(0))];
  const AttentionBackend backend = state.range(1) == 0 ? AttentionBackend::cudnn : AttentionBackend::unfused;
  const bool with_backward = state.range(2) == 1;
  const AttentionSpec spec{.mask = c.causal ? MaskType::causal : MaskType::no_mask};
  const AttentionKernelConfig config{.backend = backend};
  // The unfused path is far slower at these sizes: fewer calls per timed iteration.
  const int reps = backend == AttentionBackend::cudnn ? 5 : 2;
  try {
    const Tensor q = bench::gpu_random({c.b, c.s, c.h_q, c.d_qk}, DType::bf16, 1);
    const Tensor k = bench::gpu_random({c.b, c.s, c.h_kv, c.d_qk}, DType::bf16, 2);
    const Tensor v = bench::gpu_random({c.b, c.s, c.h_kv, c.d_v}, DType::bf16, 3);
    const Tensor dout = bench::gpu_random({c.b, c.s, c.h_q, c.d_v}, DType::bf16, 4);
    time_with_events(state, reps, [&] {
      const raw::AttentionForward f = raw::attention_forward(q, k, v, spec, std::nullopt, config);
      if (with_backward) {
        const raw::AttentionGrads g =
            raw::attention_backward(dout, Tensor(), q, k, v, f.out, f.lse, spec, std::nullopt, config);
        benchmark::DoNotOptimize(g.dq.raw_data());
      }
      benchmark::DoNotOptimize(f.out.raw_data());
    });
  } catch (const Error& e) {
    // Out of memory, or a backend that cannot run the case: skipped, with the reason in the table.
    std::string why = e.what();
    if (const size_t nl = why.find('\n'); nl != std::string::npos) why.resize(nl);
    skipped()[bench_name(state.range(0), state.range(1), state.range(2)) + "/"] = why;
    state.SkipWithError(why.c_str());
    cuda::synchronize();
    cuda::empty_cache();
    return;
  }
  const double flops = forward_flops(c) * (with_backward ? 3.5 : 1.0);
  state.counters["TFLOP/s"] = benchmark::Counter(flops * reps * 1e-12, benchmark::Counter::kIsIterationInvariantRate);
  cuda::empty_cache();  // the next case starts from an empty cache (the unfused path needs the room)
}

void register_benchmarks() {
  for (int64_t i = 0; i < static_cast<int64_t>(cases().size()); ++i) {
    for (int64_t backend : {0, 1}) {
      for (int64_t bwd : {0, 1}) {
        const std::string name = bench_name(i, backend, bwd);
        benchmark::RegisterBenchmark(name.c_str(), BM_attention)
            ->Args({i, backend, bwd})
            ->UseManualTime()
            ->Unit(benchmark::kMillisecond)
            ->Iterations(backend == 0 ? 10 : 1);
      }
    }
  }
}

// The median TFLOP/s of `name`, or the reason it was skipped.
std::string figure(const std::map<std::string, double>& values, const std::string& name, double* out) {
  for (const auto& [run, value] : values) {
    if (run.rfind(name, 0) == 0) {
      *out = value;
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.1f", value);
      return buf;
    }
  }
  *out = 0;
  for (const auto& [run, why] : skipped()) {
    if (run.rfind(name, 0) == 0) return "skipped (" + why.substr(0, 60) + ")";
  }
  return "n/a";
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (bench::no_device_to_measure("gpu_attention_bench")) return 0;
  register_benchmarks();
  bench::SummaryReporter reporter("TFLOP/s");
  benchmark::RunSpecifiedBenchmarks(&reporter);

  std::printf("\nAttention summary (median TFLOP/s, bf16; cuDNN %lld; peer = PyTorch 2.11 cuDNN SDPA on H200)\n",
              static_cast<long long>(attention_cuda::cudnn::runtime_version()));
  std::printf("%-34s | %-8s | %-12s | %-16s | %s\n", "case", "backend", "fwd TFLOP/s", "fwd+bwd TFLOP/s",
              "ratio to peer (fwd / fwd+bwd)");
  for (const AttentionCase& c : cases()) {
    for (const char* backend : {"cudnn", "unfused"}) {
      const std::string base = std::string("attention/") + c.key + "/" + backend;
      double fwd = 0, fwd_bwd = 0;
      const std::string f = figure(reporter.values(), base + "/fwd/", &fwd);
      const std::string fb = figure(reporter.values(), base + "/fwd+bwd/", &fwd_bwd);
      char ratio[64] = "-";
      if (fwd > 0 || fwd_bwd > 0) {
        std::snprintf(ratio, sizeof ratio, "%.2f / %.2f (peer %.0f / %.0f)", fwd / c.peer_fwd, fwd_bwd / c.peer_fwd_bwd,
                      c.peer_fwd, c.peer_fwd_bwd);
      }
      std::printf("%-34s | %-8s | %-12s | %-16s | %s\n", c.name, backend, f.c_str(), fb.c_str(), ratio);
    }
  }
  benchmark::Shutdown();
  return 0;
}
