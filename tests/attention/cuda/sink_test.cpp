// Attention sinks (spec.sink) on the GPU: every backend (unfused, cuDNN, auto) against the CPU
// reference on the same bf16-rounded inputs computed in f32: out, lse, dq, dk, dv and d(sink), for
// bshd causal GQA, sbhd with a sliding window and thd with padding between sequences; f32 inputs on
// the unfused path; a sink on the wrong device is refused with a message naming both devices.
// Skips without a GPU.
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "attention/attention_op.h"
#include "attention/attention_problem.h"
#include "attention/cuda/cudnn/fused_attention.h"
#include "framework/tensor/ops/copy.h"
#include "tests/attention/cuda/attention_gpu_support.h"
#include "tests/tensor/cuda/cuda_test_utils.h"

namespace cpf {
namespace {

using testing::close_to_reference;
using testing::on_cpu;
using testing::on_gpu;
using testing::random_cpu;

struct SinkCase {
  std::string name;
  QkvFormat format = QkvFormat::bshd;
  MaskType mask = MaskType::causal;
  AttentionWindow window;
  int64_t batch = 2, seq = 128, h_q = 8, h_kv = 2, d = 64;
  std::optional<SequenceInfo> info;
};

Shape shape_of(const SinkCase& c, int64_t heads) {
  switch (c.format) {
    case QkvFormat::bshd: return {c.batch, c.seq, heads, c.d};
    case QkvFormat::sbhd: return {c.seq, c.batch, heads, c.d};
    case QkvFormat::thd: return {c.seq, heads, c.d};
  }
  return {};
}

struct SinkResult {
  Tensor out, lse, dq, dk, dv, dsink;  // CPU
};

// Forward and backward on `device` (CPU tensors in, CPU tensors out).
SinkResult run_on(const Device& device, const SinkCase& c, DType dtype, uint64_t seed,
                  const AttentionKernelConfig& config) {
  auto input = [&](int64_t heads, uint64_t s) {
    return raw::to(raw::to(random_cpu(shape_of(c, heads), DType::bf16, s), dtype), device);
  };
  const Tensor q = input(c.h_q, seed), k = input(c.h_kv, seed + 1), v = input(c.h_kv, seed + 2);
  const Tensor dout = input(c.h_q, seed + 3);
  AttentionSpec spec{.qkv_format = c.format, .mask = c.mask, .window = c.window};
  spec.sink = raw::to(random_cpu({c.h_q}, DType::f32, seed + 4, -2, 2), device);
  const raw::AttentionForward f = raw::attention_forward(q, k, v, spec, c.info, config);
  const raw::AttentionGrads g = raw::attention_backward(dout, Tensor(), q, k, v, f.out, f.lse, spec, c.info, config);
  return {on_cpu(f.out), on_cpu(f.lse), on_cpu(g.dq), on_cpu(g.dk), on_cpu(g.dv), on_cpu(g.dsink)};
}

std::vector<SinkCase> cases() {
  return {
      {.name = "bshd_causal_gqa"},
      {.name = "sbhd_window",
       .format = QkvFormat::sbhd,
       .mask = MaskType::no_mask,
       .window = {32, 16},
       .h_q = 4,
       .h_kv = 4},
      {.name = "thd_padding_causal",
       .format = QkvFormat::thd,
       .mask = MaskType::padding_causal,
       .seq = 256,
       .info = SequenceInfo::from_cu_seqlens({0, 100, 130, 250}, {0, 104, 136, 256})},
  };
}

void expect_close(const SinkCase& c, const SinkResult& got, const SinkResult& want, double tol) {
  EXPECT_TRUE(close_to_reference(got.out, want.out, tol)) << c.name << " out";
  EXPECT_TRUE(close_to_reference(got.lse, want.lse, 1e-5)) << c.name << " lse";
  EXPECT_TRUE(close_to_reference(got.dq, want.dq, tol)) << c.name << " dq";
  EXPECT_TRUE(close_to_reference(got.dk, want.dk, tol)) << c.name << " dk";
  EXPECT_TRUE(close_to_reference(got.dv, want.dv, tol)) << c.name << " dv";
  EXPECT_TRUE(close_to_reference(got.dsink, want.dsink, tol)) << c.name << " dsink";
}

class AttentionSinkGpu : public testing::CudaTest {};

TEST_F(AttentionSinkGpu, EveryBackendMatchesTheCpuReferenceInBf16) {
  for (AttentionBackend backend : {AttentionBackend::unfused, AttentionBackend::cudnn, AttentionBackend::automatic}) {
    uint64_t seed = 300;
    for (const SinkCase& c : cases()) {
      SCOPED_TRACE(std::string(attention_backend_name(backend)) + " " + c.name);
      const SinkResult want = run_on(Device::cpu(), c, DType::f32, seed += 10, {});
      SinkResult got;
      try {
        got = run_on(Device::cuda(0), c, DType::bf16, seed, {.backend = backend});
      } catch (const Error& e) {
        ADD_FAILURE() << c.name << ": the call failed: " << e.what();
        continue;
      }
      expect_close(c, got, want, 3.5e-2);
    }
  }
}

TEST_F(AttentionSinkGpu, UnfusedF32MatchesTheCpuReference) {
  uint64_t seed = 500;
  for (const SinkCase& c : cases()) {
    const SinkResult want = run_on(Device::cpu(), c, DType::f32, seed += 10, {});
    const SinkResult got = run_on(Device::cuda(0), c, DType::f32, seed, {.backend = AttentionBackend::unfused});
    expect_close(c, got, want, 1e-4);
  }
}

// From cuDNN 9.13 the sink is part of the fused forward graph (max over the scores and the sink, exp(sink -
// max) in the row sum); the result equals the CPU reference. A row that sees no key keeps the plain graph.
TEST_F(AttentionSinkGpu, CudnnPutsTheSinkIntoItsForwardGraph) {
  if (attention_cuda::cudnn::runtime_version() < 91300) GTEST_SKIP() << "cuDNN before 9.13 has no sink";
  const SinkCase c{.name = "cudnn_graph_sink"};
  const Tensor q = on_gpu(random_cpu(shape_of(c, c.h_q), DType::bf16, 41));
  const Tensor k = on_gpu(random_cpu(shape_of(c, c.h_kv), DType::bf16, 42));
  const Tensor v = on_gpu(random_cpu(shape_of(c, c.h_kv), DType::bf16, 43));
  AttentionSpec spec{.mask = MaskType::causal};
  spec.sink = on_gpu(random_cpu({c.h_q}, DType::f32, 44, -2, 2));
  const AttentionProblem p = check_attention_inputs(q, k, v, spec, std::nullopt, {.backend = AttentionBackend::cudnn});
  const raw::AttentionForward native = attention_cuda::cudnn::forward(p, q, k, v);
  EXPECT_TRUE(native.sink_applied) << "cuDNN " << attention_cuda::cudnn::runtime_version()
                                   << " built no sink graph for a causal bf16 call";
  AttentionSpec cpu_spec = spec;
  cpu_spec.sink = on_cpu(spec.sink);
  const raw::AttentionForward want = raw::attention_forward(
      raw::to(on_cpu(q), DType::f32), raw::to(on_cpu(k), DType::f32), raw::to(on_cpu(v), DType::f32), cpu_spec);
  EXPECT_TRUE(close_to_reference(native.out, want.out, 2.5e-2)) << "out";
  EXPECT_TRUE(close_to_reference(native.lse, want.lse, 1e-5)) << "lse";
}

TEST_F(AttentionSinkGpu, SinkOnAnotherDeviceIsRefused) {
  const Tensor q = on_gpu(random_cpu({1, 8, 2, 16}, DType::bf16, 1));
  AttentionSpec spec{.mask = MaskType::causal};
  spec.sink = zeros({2}, {.dtype = DType::f32});
  EXPECT_CPF_ERROR(raw::attention_forward(q, q, q, spec), "the attention sink is on cpu but q is on cuda:0");
}

}  // namespace
}  // namespace cpf
