// GPT-2 124M decoding at batch 1 (docs/generation.md): the loop `cpformer generate` runs for greedy
// decoding (GPTDecoder::next_greedy: the argmax and a finite check of each row on the device, inside the
// graph, and one read-back a token), 256 new tokens after a 16-token prompt, in bf16 (the CUDA default) and fp32,
// with the decoding steps replayed from one CUDA graph and launched eagerly. Random weights: the speed
// of a step does not depend on them.
//
// Per iteration one whole generation (a fresh decoder: the prefill, the eager first step and the graph's
// capture included, as generate's figure includes them): tokens_per_s. steady_tokens_per_s times the
// last 128 tokens alone (what a longer generation approaches).
#include <benchmark/benchmark.h>

#include <chrono>
#include <vector>

#include "framework/tensor/cuda/cuda.h"
#include "models/gpt.h"
#include "models/gpt_decoder.h"

namespace cpf {
namespace {

constexpr int64_t kPrompt = 16, kNewTokens = 256, kSteadyFrom = 128;

models::GPTOptions gpt2_small(bool bf16) {
  models::GPTOptions o;
  o.vocab_size = 50304;
  o.hidden_size = 768;
  o.num_layers = 12;
  o.num_heads = 12;
  o.mlp = nn::Activation::gelu;
  o.norm = models::NormType::layernorm;
  o.positions = models::PositionType::learned;
  o.max_positions = 1024;
  o.tie_embeddings = true;
  o.bias = true;
  o.init_std = 0.02;
  if (bf16) o.compute_dtype = DType::bf16;
  return o;
}

void BM_GreedyDecoding(benchmark::State& state) {
  const bool bf16 = state.range(0) != 0, graph = state.range(1) != 0;
  Generator gen(1);
  models::GPT model(gpt2_small(bf16), &gen);
  model.eval();
  model.to(Device::cuda(0));
  double steady_seconds = 0;
  for (auto _ : state) {
    models::GPTDecoder decoder(
        model, 1, {.context = 1024, .max_length = kPrompt + kNewTokens, .kv_cache = true, .cuda_graph = graph});
    std::vector<std::vector<int64_t>> seqs(1);
    for (int64_t i = 0; i < kPrompt; ++i) seqs[0].push_back((i * 131) % 50257);
    auto steady_start = std::chrono::steady_clock::now();
    for (int64_t t = 0; t < kNewTokens; ++t) {
      if (t == kSteadyFrom) steady_start = std::chrono::steady_clock::now();
      seqs[0].push_back(decoder.next_greedy(seqs, {true}).tokens[0]);  // as generate picks greedily
    }
    steady_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - steady_start).count();
    if (graph && decoder.graph_replays() == 0) state.SkipWithError(("no graph: " + decoder.graph_note()).c_str());
  }
  const double iterations = static_cast<double>(state.iterations());
  state.counters["tokens_per_s"] =
      benchmark::Counter(static_cast<double>(kNewTokens) * iterations, benchmark::Counter::kIsRate);
  state.counters["steady_tokens_per_s"] =
      static_cast<double>(kNewTokens - kSteadyFrom) * iterations / std::max(steady_seconds, 1e-9);
  state.SetLabel(std::string(bf16 ? "bf16" : "fp32") + (graph ? ", cuda graph" : ", eager"));
}

BENCHMARK(BM_GreedyDecoding)
    ->ArgNames({"bf16", "graph"})
    ->Args({1, 1})
    ->Args({1, 0})
    ->Args({0, 1})
    ->Args({0, 0})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2.0)
    ->UseRealTime();

}  // namespace
}  // namespace cpf

BENCHMARK_MAIN();
