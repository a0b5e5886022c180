// Host-side preparation of one CP attention layer, per function, at 8k tokens per rank (cp = 4, one
// causal sequence of 32k tokens) and at 32k per rank (128k tokens): the work p2p (ring attention) does
// on the host for a pass before and between its kernels, in series with the GPU. The attention itself
// is left out (on the CPU device it would dominate everything). Rows with a last argument of 85 run
// the 32k tokens as 85 packed documents instead of one sequence; <tile> rows are at 32k tokens.
//
//   BM_RankLayoutsBuilt    the P single-rank layouts built anew (what p2p did every pass)
//   BM_RankLayoutsCached   the same from cached_rank_layouts (what p2p does now)
//   BM_RingTileInfos       one pass's P pair_sequence_info + any_visible (per ring step), as made before
//   BM_RingTilesCached     the same from cached_ring_tiles (what p2p does now)
//   BM_TileProblem         check_attention_inputs of one ring tile (every attention call; unchanged)
//   BM_CudnnMapping/<tile> map_to_cudnn of one ring tile (0 diagonal, 1 lower, 2 upper): once per call
//                          now, twice before (the backend check and the call each mapped it). Only in a
//                          build with cuDNN (build/gpushared); it needs no GPU.
//   BM_CudnnRowTables{PerCall,Cached}/<tile>  a thd tile's fix-up tables per call vs cudnn_row_tables
//   BM_CudnnSmallTablesPerCall/<tile>  the padding lengths and ragged offsets per call (now row tables)
//   BM_SelectAndLogBackend/<tile>  backend choice plus the once-per-configuration log check
//   BM_CudnnPrepare/<tile> the cuDNN preparation of a tile (checks, cached mapping, key, layouts)
//   BM_RopePositions{Built,Cached}  a CP rank's RoPE positions per call vs rope_positions_cache
//
//   build/cpu/benchmarks/cpu_cp_host_bench
//   build/gpushared/benchmarks/cpu_cp_host_bench --benchmark_filter=Mapping
#include <benchmark/benchmark.h>

#include <algorithm>

#include "attention/attention_problem.h"
#include "attention/cp/layout.h"
#include "attention/cp/layout_cache.h"
#include "attention/nn/attention_layout.h"
#include "attention/nn/rope_positions_cache.h"
#if CPF_BENCH_CUDNN_MAPPING
#include "attention/cuda/backend_selection.h"
#include "attention/cuda/cudnn/fused_attention.h"
#include "attention/cuda/cudnn/problem_mapping.h"
#include "attention/cuda/cudnn/problem_mapping_cache.h"
#include "attention/cuda/cudnn/row_fixup_tables.h"
#include "attention/cuda/cudnn/row_fixups.h"
#include "attention/cuda/device_tables.h"
#endif

namespace {

using namespace cpf;

constexpr int64_t kCp = 4, kHeads = 12, kDim = 64;

// `docs` causal sequences filling `tokens` (thd), as CP sees them: one, or packed documents of uneven
// lengths (a fixed pattern between 1/2 and 3/2 of the mean, each padded to a multiple of 2 * cp, the
// last taking the rest), like gpu_cp_bench's 85 packed documents.
cp::GlobalSequences sequence(int64_t tokens, int64_t docs = 1) {
  cp::GlobalSequences g;
  g.cu_seqlens = {0};
  g.cu_seqlens_padded = {0};
  const int64_t mean = tokens / docs, pad = 2 * kCp;
  for (int64_t d = 0; d < docs; ++d) {
    const int64_t left = tokens - g.cu_seqlens_padded.back();
    const int64_t real = d + 1 == docs ? left : std::min(left, mean / 2 + (d * 37 % 97) * mean / 97);
    g.cu_seqlens.push_back(g.cu_seqlens.back() + real);
    g.cu_seqlens_padded.push_back(g.cu_seqlens_padded.back() + (real + pad - 1) / pad * pad);
  }
  g.cu_seqlens_padded.back() = std::max(g.cu_seqlens_padded.back(), tokens);
  return g;
}

void BM_RankLayoutsBuilt(benchmark::State& state) {
  const cp::GlobalSequences g = sequence(state.range(0));
  for (auto _ : state) {
    std::vector<cp::GroupLayout> layouts;
    for (int r = 0; r < kCp; ++r) layouts.push_back(cp::make_group_layout(g, kCp, {r}));
    benchmark::DoNotOptimize(layouts);
  }
}
BENCHMARK(BM_RankLayoutsBuilt)->Arg(32768)->Arg(131072)->Unit(benchmark::kMicrosecond);

void BM_RankLayoutsCached(benchmark::State& state) {
  const cp::GlobalSequences g = sequence(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(cp::cached_rank_layouts(g, kCp));
}
BENCHMARK(BM_RankLayoutsCached)->Arg(32768)->Arg(131072)->Unit(benchmark::kMicrosecond);

void BM_RingTileInfos(benchmark::State& state) {
  const auto layouts = cp::cached_rank_layouts(sequence(state.range(0), state.range(1)), kCp);
  const AttentionWindow causal{-1, 0};
  for (auto _ : state) {
    for (int step = 0; step < kCp; ++step) {
      const auto& q = (*layouts)[1];
      const auto& kv = (*layouts)[static_cast<size_t>((1 - step + kCp) % kCp)];
      benchmark::DoNotOptimize(cp::any_visible(q, kv, causal));
      benchmark::DoNotOptimize(cp::pair_sequence_info(q, kv));
    }
  }
}
BENCHMARK(BM_RingTileInfos)->Args({32768, 1})->Args({131072, 1})->Args({32768, 85})->Unit(benchmark::kMicrosecond);

void BM_RingTilesCached(benchmark::State& state) {
  const auto layouts = cp::cached_rank_layouts(sequence(state.range(0), state.range(1)), kCp);
  for (auto _ : state) benchmark::DoNotOptimize(cp::cached_ring_tiles(layouts, 1, {-1, 0}));
}
BENCHMARK(BM_RingTilesCached)->Args({32768, 1})->Args({131072, 1})->Args({32768, 85})->Unit(benchmark::kMicrosecond);

void BM_TileProblem(benchmark::State& state) {
  const auto layouts = cp::cached_rank_layouts(sequence(state.range(0), state.range(1)), kCp);
  const SequenceInfo pair = cp::pair_sequence_info((*layouts)[1], (*layouts)[0]);  // a lower tile
  const Tensor q = empty({(*layouts)[1].tokens(), kHeads, kDim}, {.dtype = DType::bf16});
  const AttentionSpec spec{.qkv_format = QkvFormat::thd, .mask = MaskType::causal};
  for (auto _ : state) benchmark::DoNotOptimize(check_attention_inputs(q, q, q, spec, pair, {}));
}
BENCHMARK(BM_TileProblem)->Args({32768, 1})->Args({131072, 1})->Args({32768, 85})->Unit(benchmark::kMicrosecond);

#if CPF_BENCH_CUDNN_MAPPING
// Rank 1's tile against the KV block of rank 1 (diagonal), 0 (lower) or 3 (upper), at 32k tokens in
// `docs` documents.
AttentionProblem ring_tile(int64_t tile, int64_t docs) {
  const auto layouts = cp::cached_rank_layouts(sequence(32768, docs), kCp);
  const int src = tile == 0 ? 1 : tile == 1 ? 0 : 3;
  const SequenceInfo pair = cp::pair_sequence_info((*layouts)[1], (*layouts)[static_cast<size_t>(src)]);
  const Tensor q = empty({(*layouts)[1].tokens(), kHeads, kDim}, {.dtype = DType::bf16});
  const AttentionSpec spec{.qkv_format = QkvFormat::thd, .mask = MaskType::causal};
  return check_attention_inputs(q, q, q, spec, pair, {});
}

void BM_CudnnMapping(benchmark::State& state) {
  const AttentionProblem p = ring_tile(state.range(0), state.range(1));
  for (auto _ : state) benchmark::DoNotOptimize(attention_cuda::cudnn::map_to_cudnn(p));
}
BENCHMARK(BM_CudnnMapping)->ArgsProduct({{0, 1, 2}, {1, 85}})->Unit(benchmark::kMicrosecond);

void BM_CudnnMappingCached(benchmark::State& state) {
  const AttentionProblem p = ring_tile(state.range(0), state.range(1));
  for (auto _ : state) benchmark::DoNotOptimize(attention_cuda::cudnn::cached_mapping(p));
}
BENCHMARK(BM_CudnnMappingCached)->ArgsProduct({{0, 1, 2}, {1, 85}})->Unit(benchmark::kMicrosecond);

void BM_CudnnRowTables(benchmark::State& state) {
  using namespace attention_cuda::cudnn;
  const AttentionProblem p = ring_tile(state.range(0), state.range(1));
  const auto m = cached_mapping(p);
  for (auto _ : state) {
    benchmark::DoNotOptimize(packed_to_padded(p, *m));
    benchmark::DoNotOptimize(padded_to_packed(*m));
    benchmark::DoNotOptimize(flag_runs(m->q_undefined, kMaxFillRuns));
    benchmark::DoNotOptimize(flag_runs(m->kv_undefined, kMaxFillRuns));
  }
}
BENCHMARK(BM_CudnnRowTables)->ArgsProduct({{0, 1, 2}, {1, 85}})->Unit(benchmark::kMicrosecond);

// What a thd tile's fix-ups prepared per call before cudnn_row_tables: both index tables built, made
// tensors and looked up by content in device_table (on the CPU device here: the same hashing), and
// the runs of both flag sets; then the same from row_tables (one lookup by mapping identity).
void BM_CudnnRowTablesPerCall(benchmark::State& state) {
  using namespace attention_cuda;
  using namespace attention_cuda::cudnn;
  const AttentionProblem p = ring_tile(state.range(0), state.range(1));
  const auto m = cached_mapping(p);
  for (auto _ : state) {
    const std::vector<int64_t> lse = packed_to_padded(p, *m), stats = padded_to_packed(*m);
    benchmark::DoNotOptimize(device_table(from_vector(lse, {static_cast<int64_t>(lse.size())}), Device::cpu()));
    benchmark::DoNotOptimize(device_table(from_vector(stats, {static_cast<int64_t>(stats.size())}), Device::cpu()));
    benchmark::DoNotOptimize(flag_runs(m->q_undefined, kMaxFillRuns));
    benchmark::DoNotOptimize(flag_runs(m->kv_undefined, kMaxFillRuns));
  }
}
BENCHMARK(BM_CudnnRowTablesPerCall)->ArgsProduct({{0, 1, 2}, {1, 85}})->Unit(benchmark::kMicrosecond);

void BM_CudnnRowTablesCached(benchmark::State& state) {
  const AttentionProblem p = ring_tile(state.range(0), state.range(1));
  const auto m = attention_cuda::cudnn::cached_mapping(p);
  for (auto _ : state) benchmark::DoNotOptimize(attention_cuda::cudnn::row_tables(m, p, Device::cpu()));
}
BENCHMARK(BM_CudnnRowTablesCached)->ArgsProduct({{0, 1, 2}, {1, 85}})->Unit(benchmark::kMicrosecond);

// A thd tile's small per-call tables before the row tables kept them: both padding lengths and the four
// ragged offset tables (b + 1 entries), each made a tensor and looked up by content in device_table.
void BM_CudnnSmallTablesPerCall(benchmark::State& state) {
  using namespace attention_cuda;
  using namespace attention_cuda::cudnn;
  const AttentionProblem p = ring_tile(state.range(0), state.range(1));
  const auto m = cached_mapping(p);
  const int64_t row = p.h_q * p.d_qk;
  for (auto _ : state) {
    benchmark::DoNotOptimize(device_table(from_vector(m->seq_len_q, {m->b}), Device::cpu()));
    benchmark::DoNotOptimize(device_table(from_vector(m->seq_len_kv, {m->b}), Device::cpu()));
    for (int i = 0; i < 4; ++i) {
      benchmark::DoNotOptimize(
          device_table(ragged_offsets(i % 3 == 0 ? m->q_token : m->kv_token, i % 3 == 0 ? p.s_q : p.s_kv, row, false),
                       Device::cpu()));
    }
  }
}
BENCHMARK(BM_CudnnSmallTablesPerCall)->ArgsProduct({{0, 1, 2}, {1, 85}})->Unit(benchmark::kMicrosecond);

// Backend selection of one ring tile without a GPU (cuDNN answers "no CUDA device is visible", after
// its checks and mapping lookup): the choice and the once-per-configuration log line's key.
void BM_SelectAndLogBackend(benchmark::State& state) {
  const AttentionProblem p = ring_tile(state.range(0), state.range(1));
  for (auto _ : state) {
    benchmark::DoNotOptimize(attention_cuda::select_and_log_backend(p, DType::bf16, false, false, Device::cuda(0)));
  }
}
BENCHMARK(BM_SelectAndLogBackend)->ArgsProduct({{0, 1, 2}, {1, 85}})->Unit(benchmark::kMicrosecond);

// The cuDNN preparation of one ring tile without a GPU: the checks, the cached mapping, the key and
// layouts (unsupported_reason stops at "no CUDA device is visible", after all of that).
void BM_CudnnPrepare(benchmark::State& state) {
  const AttentionProblem p = ring_tile(state.range(0), state.range(1));
  for (auto _ : state)
    benchmark::DoNotOptimize(attention_cuda::cudnn::unsupported_reason(p, DType::bf16, false, false));
}
BENCHMARK(BM_CudnnPrepare)->ArgsProduct({{0, 1, 2}, {1, 85}})->Unit(benchmark::kMicrosecond);
#endif

// RoPE positions of a CP rank (cp = 4, rank 1) for x (tokens / 4, 12, 64) thd, one sequence of
// `tokens` (what the GPT passes: its batches are thd): built per call as before (the shard's positions
// and the q/k comparison of the resolved positions) and from the cache. On a GPU the built path also
// uploads the table each call.
void BM_RopePositionsBuilt(benchmark::State& state) {
  const int64_t tokens = state.range(0);
  const Tensor x = empty({tokens / kCp, kHeads, kDim}, {.dtype = DType::bf16});
  const std::optional<SequenceInfo> seq = SequenceInfo::from_cu_seqlens({0, tokens}, {0, tokens});
  for (auto _ : state) {
    benchmark::DoNotOptimize(nn::cp_rope_positions(x, QkvFormat::thd, seq, false, kCp, 1));
    benchmark::DoNotOptimize(seq->resolved_q_positions() == seq->resolved_kv_positions());  // the q/k check
  }
}
BENCHMARK(BM_RopePositionsBuilt)->Arg(32768)->Arg(131072)->Unit(benchmark::kMicrosecond);

void BM_RopePositionsCached(benchmark::State& state) {
  const int64_t tokens = state.range(0);
  const Tensor x = empty({tokens / kCp, kHeads, kDim}, {.dtype = DType::bf16});
  const std::optional<SequenceInfo> seq = SequenceInfo::from_cu_seqlens({0, tokens}, {0, tokens});
  for (auto _ : state) {
    benchmark::DoNotOptimize(nn::cached_rope_positions(x, QkvFormat::thd, seq, false, kCp, 1));
    benchmark::DoNotOptimize(nn::same_rope_positions(*seq));
  }
}
BENCHMARK(BM_RopePositionsCached)->Arg(32768)->Arg(131072)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
