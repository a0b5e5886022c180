// CPU flash attention: forward and forward+backward throughput, and peak memory, at s = 1024 and
// 4096, d = 64, causal and not. Results and the command that produced them: docs/attention.md.
//
//   build/attn/benchmarks/cpu_attention_bench --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
//
// FLOPs follow the GPU peer convention (docs/attention.md): forward = 2 * b * h * s^2 * (d_qk + d_v),
// halved when causal; forward+backward = 3.5 x forward. GFLOPS is that count over wall time.
//
// Memory: before the timed loop, one untimed call runs between a reset of the kernel's peak
// resident set (Linux: "5" > /proc/self/clear_refs) and a read of VmHWM. peak_MiB is the rise above
// the resident set at the start of that call (inputs already allocated, outputs and gradients
// included). tensors_MiB is the exact peak of live tensor storage over the same call (a counting
// wrapper around the CPU backend). Both grow linearly in s; scores_MiB is what one (s x s) f32
// score matrix per head would have cost, for comparison.
#include <benchmark/benchmark.h>
#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "attention/dot_product_attention.h"
#include "framework/autograd/engine.h"
#include "framework/autograd/grad_mode.h"
#include "framework/tensor/cpu/strided_loop.h"
#include "framework/tensor/random.h"
#include "framework/tensor/storage.h"

namespace {

constexpr int64_t kBatch = 1, kHeads = 8, kDim = 64;

int64_t status_kib(const char* key) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(std::strlen(key)));
  }
  return -1;
}

bool reset_peak_rss() {
  std::ofstream refs("/proc/self/clear_refs");
  refs << "5";
  return static_cast<bool>(refs);
}

// Wraps the CPU backend to count live tensor storage bytes and their peak: exact where the RSS
// counters are batched per thread (a few MiB of slack with many threads).
class CountingBackend final : public cpf::DeviceBackend {
 public:
  explicit CountingBackend(cpf::DeviceBackend& inner) : inner_(inner) {}
  void* allocate(size_t nbytes, cpf::Device device) override {
    void* p = inner_.allocate(nbytes, device);
    const int64_t now = live_ += static_cast<int64_t>(nbytes);
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    return p;
  }
  void deallocate(void* ptr, size_t nbytes, cpf::Device device) noexcept override {
    inner_.deallocate(ptr, nbytes, device);
    live_ -= static_cast<int64_t>(nbytes);
  }
  void copy(void* dst, cpf::Device dst_device, const void* src, cpf::Device src_device, size_t nbytes) override {
    inner_.copy(dst, dst_device, src, src_device, nbytes);
  }
  void fill_zero(void* ptr, size_t nbytes, cpf::Device device) override { inner_.fill_zero(ptr, nbytes, device); }
  int device_count() const override { return inner_.device_count(); }

  int64_t reset_peak() { return peak_ = live_.load(); }  // returns the live bytes now
  int64_t peak() const { return peak_; }

 private:
  cpf::DeviceBackend& inner_;
  std::atomic<int64_t> live_{0}, peak_{0};
};

CountingBackend* g_counting = nullptr;

struct Inputs {
  cpf::Tensor q, k, v, dout;
  explicit Inputs(int64_t s) {
    cpf::Generator gen(42);
    q = cpf::randn({kBatch, s, kHeads, kDim}, {}, &gen).set_requires_grad(true);
    k = cpf::randn({kBatch, s, kHeads, kDim}, {}, &gen).set_requires_grad(true);
    v = cpf::randn({kBatch, s, kHeads, kDim}, {}, &gen).set_requires_grad(true);
    dout = cpf::randn({kBatch, s, kHeads, kDim}, {}, &gen);
  }
};

cpf::AttentionSpec spec_for(bool causal) {
  return {.qkv_format = cpf::QkvFormat::bshd, .mask = causal ? cpf::MaskType::causal : cpf::MaskType::no_mask};
}

// Checks a few output rows against plain double loops before anything is timed.
void check_rows(const Inputs& in, const cpf::Tensor& out, int64_t s, bool causal) {
  const float* q = in.q.data<float>();
  const float* k = in.k.data<float>();
  const float* v = in.v.data<float>();
  const float* o = out.data<float>();
  const double scale = 1.0 / std::sqrt(static_cast<double>(kDim));
  for (int64_t i : {int64_t{0}, s / 2 + 3, s - 1}) {
    const int64_t h = i % kHeads, keys = causal ? i + 1 : s;
    auto at = [&](const float* t, int64_t token, int64_t d) {
      return static_cast<double>(t[(token * kHeads + h) * kDim + d]);
    };
    std::vector<double> w(static_cast<size_t>(keys));
    double max = -INFINITY, sum = 0;
    for (int64_t j = 0; j < keys; ++j) {
      double dot = 0;
      for (int64_t d = 0; d < kDim; ++d) dot += at(q, i, d) * at(k, j, d);
      w[j] = dot * scale;
      max = std::max(max, w[j]);
    }
    for (double& x : w) sum += (x = std::exp(x - max));
    for (int64_t d = 0; d < kDim; ++d) {
      double expected = 0;
      for (int64_t j = 0; j < keys; ++j) expected += w[j] / sum * at(v, j, d);
      if (std::abs(expected - at(o, i, d)) > 1e-4) {
        std::fprintf(stderr, "cpu_attention_bench: row %lld dim %lld: %g vs %g\n", static_cast<long long>(i),
                     static_cast<long long>(d), at(o, i, d), expected);
        std::abort();
      }
    }
  }
}

void run_once(const Inputs& in, bool causal, bool with_backward) {
  if (!with_backward) {
    cpf::NoGradGuard no_grad;
    cpf::AttentionOutput r = cpf::dot_product_attention(in.q, in.k, in.v, spec_for(causal));
    benchmark::DoNotOptimize(r.out.raw_data());
    return;
  }
  cpf::AttentionOutput r = cpf::dot_product_attention(in.q, in.k, in.v, spec_for(causal));
  cpf::backward(r.out, in.dout);
  benchmark::DoNotOptimize(in.q.grad().raw_data());
  for (const cpf::Tensor* t : {&in.q, &in.k, &in.v}) t->set_grad(cpf::Tensor());
}

void BM_attention(benchmark::State& state) {
  const int64_t s = state.range(0);
  const bool causal = state.range(1) != 0, with_backward = state.range(2) != 0;
  const Inputs in(s);
  {
    cpf::NoGradGuard no_grad;
    check_rows(in, cpf::dot_product_attention(in.q, in.k, in.v, spec_for(causal)).out, s, causal);
  }
  const bool measured = reset_peak_rss();
  const int64_t rss_before = status_kib("VmRSS:");
  const int64_t live_before = g_counting->reset_peak();
  run_once(in, causal, with_backward);
  const int64_t peak = status_kib("VmHWM:");
  const int64_t tensor_peak = g_counting->peak() - live_before;
  for (auto _ : state) run_once(in, causal, with_backward);

  const double forward_flops = 2.0 * kBatch * kHeads * static_cast<double>(s) * s * (2 * kDim) * (causal ? 0.5 : 1.0);
  state.counters["GFLOPS"] = benchmark::Counter((with_backward ? 3.5 : 1.0) * forward_flops * 1e-9,
                                                benchmark::Counter::kIsIterationInvariantRate);
  state.counters["peak_MiB"] = measured ? static_cast<double>(peak - rss_before) / 1024.0 : -1.0;
  state.counters["tensors_MiB"] = static_cast<double>(tensor_peak) / (1 << 20);
  state.counters["scores_MiB"] = kBatch * kHeads * static_cast<double>(s) * s * 4.0 / (1 << 20);
  state.counters["threads"] = cpf::cpu::max_threads();
}

void register_all() {
  for (int64_t with_backward : {0, 1}) {
    for (int64_t causal : {0, 1}) {
      for (int64_t s : {1024, 4096}) {
        const std::string name =
            std::string(with_backward ? "attention_fwd_bwd" : "attention_fwd") + (causal ? "/causal" : "/full");
        benchmark::RegisterBenchmark(name.c_str(), BM_attention)
            ->Args({s, causal, with_backward})
            ->ArgNames({"s", "causal", "bwd"})
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  // Large blocks always come from mmap and go back on free, so each measured call starts from fresh
  // pages and its peak RSS rise is its own live memory (glibc otherwise recycles freed heap).
  mallopt(M_MMAP_THRESHOLD, 64 * 1024);
  mallopt(M_TRIM_THRESHOLD, 64 * 1024);
  static CountingBackend counting(cpf::device_backend(cpf::DeviceType::cpu));  // before any tensor exists
  cpf::register_device_backend(cpf::DeviceType::cpu, &counting);
  g_counting = &counting;
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
