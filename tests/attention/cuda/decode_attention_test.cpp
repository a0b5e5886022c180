// The decoding attention kernel (attention/cuda/decode_attention_kernel.cu) against the CPU's
// decode_attention (the f64 host loop) on the same inputs: f32, bf16 and f64, GQA/MQA, sliding windows,
// sinks, empty slots, head dims from 8 to the MLA latent's 577 / 513 and the kernel's 640 limit, i32 and
// i64 lengths; the appending form (new rows stored and read in the same kernel, strided inputs); one captured CUDA
// graph replayed with rewritten lengths gives each step's rows; lengths past the slot are reported by the device check;
// head dims past the limit are refused by name. Few sequences x heads over long slots split the positions
// over several blocks (the cases with capacities 200 and up).
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "attention/cuda/decode_attention_kernel.cuh"
#include "attention/decode_attention.h"
#include "framework/autograd/grad_mode.h"
#include "framework/tensor/cuda/cuda.h"
#include "framework/tensor/device_graph.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/views.h"
#include "tests/tensor/cuda/cuda_test_utils.h"

namespace cpf {
namespace {

using testing::all_close;
using testing::on_cpu;
using testing::on_gpu;
using testing::random_cpu;

class CudaDecodeAttention : public testing::CudaTest {};

struct Case {
  int64_t seqs, heads, kv_heads, dim_qk, dim_v, capacity;
  std::vector<int64_t> lengths;
  AttentionWindow window{};
  bool sink = false;
};

AttentionSpec spec_of(const Case& c, DType dtype) {
  AttentionSpec spec{.qkv_format = QkvFormat::thd, .mask = MaskType::causal, .window = c.window};
  if (c.sink) {
    std::vector<double> logits;
    for (int64_t h = 0; h < c.heads; ++h) logits.push_back(0.25 * static_cast<double>(h) - 0.5);
    spec.sink = raw::to(from_vector(logits, {c.heads}), dtype == DType::f64 ? DType::f64 : DType::f32);
  }
  return spec;
}

void expect_matches_cpu(const Case& c, DType dtype, DType length_dtype, double tol) {
  NoGradGuard no_grad;
  const Tensor q = raw::to(random_cpu({c.seqs, c.heads, c.dim_qk}, DType::f64, 1, -2, 2), dtype);
  const Tensor keys = raw::to(random_cpu({c.seqs * c.capacity, c.kv_heads, c.dim_qk}, DType::f64, 2, -2, 2), dtype);
  const Tensor values = raw::to(random_cpu({c.seqs * c.capacity, c.kv_heads, c.dim_v}, DType::f64, 3), dtype);
  const Tensor lengths = raw::to(from_vector(c.lengths, {c.seqs}), length_dtype);
  const AttentionSpec spec = spec_of(c, dtype);
  AttentionSpec gpu_spec = spec;
  if (spec.sink.defined()) gpu_spec.sink = on_gpu(spec.sink);
  const Tensor want = decode_attention(q, keys, values, lengths, spec);
  const Tensor got = decode_attention(on_gpu(q), on_gpu(keys), on_gpu(values), on_gpu(lengths), gpu_spec);
  EXPECT_EQ(got.dtype(), dtype);
  EXPECT_TRUE(all_close(raw::to(on_cpu(got), DType::f64), raw::to(want, DType::f64), tol, tol))
      << dtype_name(dtype) << " H=" << c.heads << "/" << c.kv_heads << " D=" << c.dim_qk << "/" << c.dim_v;
}

TEST_F(CudaDecodeAttention, MatchesTheCpuReference) {
  const std::vector<Case> cases{
      {.seqs = 3, .heads = 4, .kv_heads = 2, .dim_qk = 8, .dim_v = 8, .capacity = 20, .lengths = {20, 1, 13}},
      {.seqs = 1, .heads = 12, .kv_heads = 12, .dim_qk = 64, .dim_v = 64, .capacity = 1024, .lengths = {777}},
      {.seqs = 2, .heads = 8, .kv_heads = 1, .dim_qk = 128, .dim_v = 128, .capacity = 300, .lengths = {300, 0}},
      {.seqs = 2,
       .heads = 6,
       .kv_heads = 3,
       .dim_qk = 96,
       .dim_v = 40,
       .capacity = 50,
       .lengths = {50, 17},
       .window = {7, 0},
       .sink = true},
      {.seqs = 2,
       .heads = 4,
       .kv_heads = 1,
       .dim_qk = 577,
       .dim_v = 513,
       .capacity = 40,
       .lengths = {9, 40},
       .sink = true},  // the MLA latent form: kv_lora_rank 512 + rope 64 + bias column
      {.seqs = 1, .heads = 2, .kv_heads = 1, .dim_qk = 640, .dim_v = 640, .capacity = 33, .lengths = {33}},
      // Few rows over long slots: the positions split over several blocks (decode_splits), then combined.
      {.seqs = 1,
       .heads = 12,
       .kv_heads = 4,
       .dim_qk = 64,
       .dim_v = 64,
       .capacity = 600,
       .lengths = {600},
       .window = {100, 0},
       .sink = true},
      {.seqs = 3,
       .heads = 4,
       .kv_heads = 2,
       .dim_qk = 96,
       .dim_v = 40,
       .capacity = 256,
       .lengths = {256, 1, 0},
       .sink = true},  // 8 splits: a length of 1 leaves 7 of them empty, 0 gives zeros
      {.seqs = 2,
       .heads = 4,
       .kv_heads = 1,
       .dim_qk = 577,
       .dim_v = 513,
       .capacity = 200,
       .lengths = {9, 200},
       .sink = true},
  };
  for (const Case& c : cases) {
    expect_matches_cpu(c, DType::f32, DType::i64, 2e-5);
    expect_matches_cpu(c, DType::f64, DType::i32, 1e-12);
    // bf16 rounds the output once from f32 sums: within a bf16 step of the f64 result.
    expect_matches_cpu(c, DType::bf16, DType::i64, 1e-2);
  }
}

// The appending kernel: new rows stored (exactly) and the attention equal to the CPU's, from strided
// views of a fused projection, in one captured graph replayed with growing lengths.
TEST_F(CudaDecodeAttention, AppendMatchesTheCpuAndReplaysInAGraph) {
  NoGradGuard no_grad;
  const int64_t heads = 6, kv_heads = 2, dim = 64;
  const AttentionSpec spec{.qkv_format = QkvFormat::thd, .mask = MaskType::causal};
  // Capacity 40: one block per (sequence, head); 300: the positions split (the new row in the last split).
  for (const std::pair<DType, int64_t>& run : std::vector<std::pair<DType, int64_t>>{
           {DType::f32, 40}, {DType::bf16, 40}, {DType::f32, 300}, {DType::bf16, 300}}) {
    const DType dtype = run.first;
    const int64_t capacity = run.second;
    const Tensor qkv = raw::to(random_cpu({2, heads + 2 * kv_heads, dim}, DType::f64, 14, -2, 2), dtype);
    Tensor keys = raw::to(random_cpu({2 * capacity, kv_heads, dim}, DType::f64, 15, -2, 2), dtype);
    Tensor values = raw::to(random_cpu({2 * capacity, kv_heads, dim}, DType::f64, 16), dtype);
    const Tensor gqkv = on_gpu(qkv), gkeys = on_gpu(keys), gvalues = on_gpu(values);
    const auto parts = [&](const Tensor& t) {
      return std::vector<Tensor>{raw::narrow(t, 1, 0, heads), raw::narrow(t, 1, heads, kv_heads),
                                 raw::narrow(t, 1, heads + kv_heads, kv_heads)};
    };
    const Tensor glengths = on_gpu(from_vector<int64_t>({1, 1}, {2}));
    Tensor out;
    const std::vector<Tensor> g = parts(gqkv);
    const DeviceGraph graph = DeviceGraph::capture(
        Device::cuda(0), [&] { out = decode_attention_append(g[0], g[1], g[2], gkeys, gvalues, glengths, spec); });
    const std::vector<Tensor> c = parts(qkv);
    for (const std::vector<int64_t>& step :
         std::vector<std::vector<int64_t>>{{1, 3}, {2, 4}, {40, 0}, {17, 9}, {capacity, capacity / 2}}) {
      raw::copy_(glengths, from_vector(step, {2}));
      graph.replay();
      const Tensor want = decode_attention_append(c[0], c[1], c[2], keys, values, from_vector(step, {2}), spec);
      EXPECT_TRUE(all_close(on_cpu(gkeys), keys, 0, 0)) << dtype_name(dtype);
      EXPECT_TRUE(all_close(on_cpu(gvalues), values, 0, 0)) << dtype_name(dtype);
      const double tol = dtype == DType::bf16 ? 1e-2 : 2e-5;
      EXPECT_TRUE(all_close(raw::to(on_cpu(out), DType::f64), raw::to(want, DType::f64), tol, tol))
          << dtype_name(dtype) << " lengths " << step[0] << ", " << step[1];
    }
  }
}

TEST_F(CudaDecodeAttention, OneCapturedGraphServesEveryLength) {
  NoGradGuard no_grad;
  const Case c{.seqs = 2, .heads = 4, .kv_heads = 2, .dim_qk = 64, .dim_v = 64, .capacity = 64, .lengths = {}};
  const Tensor q = on_gpu(random_cpu({2, 4, 64}, DType::f32, 4, -2, 2));
  const Tensor keys = on_gpu(random_cpu({128, 2, 64}, DType::f32, 5, -2, 2));
  const Tensor values = on_gpu(random_cpu({128, 2, 64}, DType::f32, 6));
  const Tensor lengths = on_gpu(from_vector<int64_t>({1, 1}, {2}));
  Tensor out;
  const DeviceGraph graph = DeviceGraph::capture(
      Device::cuda(0), [&] { out = decode_attention(q, keys, values, lengths, spec_of(c, DType::f32)); });
  for (const std::vector<int64_t>& step : std::vector<std::vector<int64_t>>{{1, 5}, {2, 6}, {64, 7}, {30, 0}}) {
    raw::copy_(lengths, from_vector(step, {2}));
    graph.replay();
    const Tensor want =
        decode_attention(on_cpu(q), on_cpu(keys), on_cpu(values), from_vector(step, {2}), spec_of(c, DType::f32));
    EXPECT_TRUE(all_close(on_cpu(out), want, 2e-5, 2e-5)) << step[0] << ", " << step[1];
  }
}

// The split policy: about two blocks an SM when sequences x heads leave SMs idle, at least 32 positions
// of the capacity a split, at most 16.
TEST_F(CudaDecodeAttention, SplitsThePositionsOnlyWhereRowsAreFew) {
  EXPECT_EQ(attention_cuda::decode::decode_splits(1, 12, 1024, 132), 16);  // GPT-2 124M at batch 1
  EXPECT_EQ(attention_cuda::decode::decode_splits(1, 12, 256, 132), 8);    // capped by the capacity
  EXPECT_EQ(attention_cuda::decode::decode_splits(4, 12, 1024, 132), 6);   // 48 blocks: ceil(264 / 48)
  EXPECT_EQ(attention_cuda::decode::decode_splits(8, 32, 1024, 132), 1);   // 256 blocks fill the SMs
  EXPECT_EQ(attention_cuda::decode::decode_splits(1, 12, 40, 132), 1);     // a short slot
  EXPECT_EQ(attention_cuda::decode::decode_splits(0, 12, 1024, 132), 1);
}

TEST_F(CudaDecodeAttention, RefusesLengthsPastTheSlotAndHeadDimsPastTheKernel) {
  NoGradGuard no_grad;
  const Tensor q = on_gpu(random_cpu({1, 2, 8}, DType::f32, 7));
  const Tensor keys = on_gpu(random_cpu({4, 2, 8}, DType::f32, 8));
  const AttentionSpec spec{.qkv_format = QkvFormat::thd, .mask = MaskType::causal};
  EXPECT_CPF_ERROR(
      {
        decode_attention(q, keys, keys, on_gpu(from_vector<int64_t>({5}, {1})), spec);
        cuda::synchronize();
      },
      "decode_attention (lengths): index 5 at position [0] is out of range for dim 0 of size 5");
  const Tensor wide = on_gpu(random_cpu({1, 1, 641}, DType::f32, 9));
  const Tensor wide_keys = on_gpu(random_cpu({4, 1, 641}, DType::f32, 10));
  EXPECT_CPF_ERROR(decode_attention(wide, wide_keys, wide_keys, on_gpu(from_vector<int64_t>({2}, {1})), spec),
                   "decode_attention (cuda): head dims 641 / 641 exceed the kernel's 640");
}

}  // namespace
}  // namespace cpf
