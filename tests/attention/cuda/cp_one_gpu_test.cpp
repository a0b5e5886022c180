// Context parallelism on one GPU: every CP strategy (p2p, all_gather, a2a at cp = 2; a2a+p2p as 2 x 2)
// runs with thread ranks that all hold cuda:0 (dist::launch with DevicePolicy::cuda; the thread
// process group stages device tensors through the host), causal and not, bshd and thd, MHA and GQA.
// Each rank's out, lse, dq, dk, dv must equal its shard of the single-rank full-sequence result on
// the CPU (tests/attention/cp/cp_harness.h builds the cases):
//   f32, attention.backend unfused: the CPU equivalence tolerances, |a - b| <= 2e-6 + 1e-5 |b|;
//   bf16, attention.backend auto (cuDNN where it runs a step, unfused elsewhere, e.g. the backward
//   steps that carry a gradient on lse): TransformerEngine's tolerances, atol = rtol = 2.5e-2 for MHA
//   and 3.5e-2 for GQA, against the f32 reference computed from the same bf16-rounded inputs; lse
//   (f32 on both sides) within 1e-5 relative for unfused and those tolerances for auto.
// The causal GQA cases also run with an attention sink: d(sink) summed over the ranks against the reference.
#include <gtest/gtest.h>

#include <optional>
#include <sstream>

#include "attention/cp/lse_merge.h"
#include "attention/cuda/cudnn/grouped_execution.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/views.h"
#include "tests/attention/cp/cp_grid.h"
#include "tests/tensor/cuda/cuda_test_utils.h"

namespace cpf::cp::testing {
namespace {

// Head dims of 64 so that cuDNN (multiples of 8) can take the bf16 steps on auto.
const HeadCase kHeads[] = {
    {"mha", 4, 4, 64, 64},
    {"gqa", 4, 2, 64, 64},
};

struct Param {
  CommType comm;
  int cp;
  QkvFormat format;
  MaskType mask;
  HeadCase heads;
  DType dtype;
  AttentionBackend backend;
  bool sink = false;  // with an attention sink (spec.sink): d(sink) summed over the ranks is compared too
};

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const Param& p = info.param;
  std::ostringstream os;
  os << strategy_test_name(p.comm, p.cp, p.format) << "_" << mask_type_name(p.mask) << "_" << p.heads.name << "_"
     << dtype_name(p.dtype) << "_" << attention_backend_name(p.backend);
  if (p.sink) os << "_sink";
  return os.str();
}

std::vector<Param> grid() {
  std::vector<Param> params;
  for (CommType comm : {CommType::p2p, CommType::all_gather, CommType::a2a, CommType::a2a_p2p}) {
    const int cp = comm == CommType::a2a_p2p ? 4 : 2;
    for (QkvFormat format : {QkvFormat::bshd, QkvFormat::thd}) {
      for (MaskType mask : {MaskType::no_mask, MaskType::causal}) {
        for (const HeadCase& heads : kHeads) {
          params.push_back({comm, cp, format, mask, heads, DType::f32, AttentionBackend::unfused});
          params.push_back({comm, cp, format, mask, heads, DType::bf16, AttentionBackend::automatic});
          if (mask == MaskType::causal && heads.kv_heads != heads.heads) {
            params.push_back({comm, cp, format, mask, heads, DType::f32, AttentionBackend::unfused, true});
            params.push_back({comm, cp, format, mask, heads, DType::bf16, AttentionBackend::automatic, true});
          }
        }
      }
    }
  }
  return params;
}

CpCase case_of(const Param& p) {
  const AttentionWindow window = p.mask == MaskType::causal ? AttentionWindow{-1, 0} : AttentionWindow{};
  CpCase c = grid_case(p.comm, p.cp, p.format, p.mask, window, p.heads);
  c.dtype = DType::f32;  // the global problem is drawn in f32; bf16 runs round it once
  c.sink = p.sink;
  return c;
}

Global rounded_to(const Global& g, DType dtype) {
  Global r = g;
  r.q = raw::to(g.q, dtype);
  r.k = raw::to(g.k, dtype);
  r.v = raw::to(g.v, dtype);
  r.dout = raw::to(g.dout, dtype);
  return r;  // dlse stays f32: lse is f32 for bf16 inputs
}

// run_cp (cp_harness.h) on cuda:0: every rank's shards are moved to its device (cuda:0 for all on a
// one-GPU machine), the strategy's attention calls use `flash`, and the results come back to the CPU.
std::vector<Tensors> run_cp_on_gpu(const CpCase& c, const Global& g, const AttentionKernelConfig& flash) {
  std::vector<Tensors> results(static_cast<size_t>(c.cp));
  const int64_t lse_dim = c.format == QkvFormat::thd ? 1 : 2;
  dist::launch(
      c.cp,
      [&](dist::RankContext& rc) {
        dist::MeshShape shape;
        shape.cp = c.cp;
        if (c.comm == CommType::a2a_p2p) {
          shape.cp_a2a = c.a2a;
          shape.hierarchical_cp = true;
        }
        shape.require_cp = true;
        dist::DeviceMesh mesh(rc.world, shape);
        ContextParallel cp{c.comm, mesh.cp(), mesh.cp_a2a(), mesh.cp_p2p(), flash};
        const int r = rc.rank;
        auto on_device = [&](const Tensor& t, int64_t dim) { return raw::to(shard(c, g, t, dim, r), rc.device); };
        Tensor q = on_device(g.q, g.seq_dim).set_requires_grad();
        Tensor k = on_device(g.k, g.seq_dim).set_requires_grad();
        Tensor v = on_device(g.v, g.seq_dim).set_requires_grad();
        AttentionSpec spec = spec_of(c);
        if (g.sink.defined()) spec.sink = raw::to(g.sink, rc.device).set_requires_grad();
        auto [out, lse] = context_parallel_attention(dual_chunk_of(q, cp), dual_chunk_of(k, cp), dual_chunk_of(v, cp),
                                                     spec, g.seq, cp);
        backward({out, lse}, {on_device(g.dout, g.seq_dim), raw::to(on_device(g.dlse, lse_dim), lse.dtype())});
        auto host = [](const Tensor& t) { return raw::to(t.detach(), Device::cpu()); };
        results[static_cast<size_t>(r)] = {host(out),      host(lse),
                                           host(q.grad()), host(k.grad()),
                                           host(v.grad()), spec.sink.defined() ? host(spec.sink.grad()) : Tensor()};
      },
      {.timeout = std::chrono::milliseconds(120'000), .devices = dist::DevicePolicy::cuda});
  return results;
}

class CpOneGpu : public ::testing::WithParamInterface<Param>, public ::cpf::testing::CudaTest {};

TEST_P(CpOneGpu, ShardsEqualTheSingleRankResult) {
  const Param& p = GetParam();
  unsetenv("CPF_ATTENTION_BACKEND");  // the parameter decides
  const CpCase c = case_of(p);
  const CpQuery query{c.comm, c.cp, c.a2a, c.format, c.mask, c.window, c.heads, c.kv_heads, c.d_qk, c.d_v, false};
  ASSERT_FALSE(unsupported_reason(query).has_value()) << *unsupported_reason(query);

  const Global g32 = make_global(c);
  const Global g = p.dtype == DType::f32 ? g32 : rounded_to(g32, p.dtype);
  // The reference sees exactly the inputs the GPU run sees, in f32.
  const Tensors ref = reference(c, p.dtype == DType::f32 ? g32 : rounded_to(rounded_to(g32, p.dtype), DType::f32));
  const auto got = run_cp_on_gpu(c, g, {.backend = p.backend});

  double atol = 2e-6, rtol = 1e-5, lse_atol = 2e-6, lse_rtol = 1e-5;
  if (p.dtype == DType::bf16) {
    atol = rtol = c.kv_heads == c.heads ? 2.5e-2 : 3.5e-2;
    if (p.backend != AttentionBackend::unfused) lse_atol = lse_rtol = atol;
  }
  const int64_t lse_dim = c.format == QkvFormat::thd ? 1 : 2;
  for (int r = 0; r < c.cp; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r) + " of " + param_name({p, 0}));
    const Tensors& t = got[static_cast<size_t>(r)];
    auto f32 = [](const Tensor& x) { return raw::to(x, DType::f32); };
    EXPECT_TRUE(::cpf::testing::all_close(f32(t.out), shard(c, g, ref.out, g.seq_dim, r), atol, rtol)) << "out";
    EXPECT_TRUE(::cpf::testing::all_close(f32(t.lse), shard(c, g, ref.lse, lse_dim, r), lse_atol, lse_rtol)) << "lse";
    EXPECT_TRUE(::cpf::testing::all_close(f32(t.dq), shard(c, g, ref.dq, g.seq_dim, r), atol, rtol)) << "dq";
    EXPECT_TRUE(::cpf::testing::all_close(f32(t.dk), shard(c, g, ref.dk, g.seq_dim, r), atol, rtol)) << "dk";
    EXPECT_TRUE(::cpf::testing::all_close(f32(t.dv), shard(c, g, ref.dv, g.seq_dim, r), atol, rtol)) << "dv";
  }
  if (p.sink) {
    // Each rank's d(sink) covers its own rows; their sum is the single-rank gradient.
    for (const Tensors& t : got) {  // whole on every rank: CP attention sums it over the group
      EXPECT_TRUE(::cpf::testing::all_close(raw::to(t.dsink, DType::f32), ref.dsink, atol * 10, rtol)) << "d(sink)";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryStrategy, CpOneGpu, ::testing::ValuesIn(grid()), param_name);

// Packed documents of very different lengths: p2p's ring tiles run one cuDNN execution per group of
// similar lengths (attention/cuda/cudnn/grouped_execution.h). The shards match the single-rank result
// grouped as finely as possible (call_rows 0) and with one execution per tile (-1).
class CpThdGroupsOnGpu : public ::cpf::testing::CudaTest {};

TEST_F(CpThdGroupsOnGpu, P2pShardsMatchGroupedAndNot) {
  unsetenv("CPF_ATTENTION_BACKEND");  // auto: cuDNN for the bf16 tiles it runs
  CpCase c = grid_case(CommType::p2p, 2, QkvFormat::thd, MaskType::causal, AttentionWindow{-1, 0}, kHeads[1]);
  c.thd_lengths = {4096, 300, 700, 4093, 130, 950, 512, 200, 2048, 1000};
  c.dtype = DType::f32;
  const Global g = rounded_to(make_global(c), DType::bf16);
  const Tensors ref = reference(c, rounded_to(g, DType::f32));
  const double tol = 3.5e-2;  // GQA, TransformerEngine's bf16 bound (lse included, as for auto above)
  for (const int64_t call_rows : {int64_t{0}, int64_t{-1}}) {
    attention_cuda::cudnn::set_thd_group_call_rows_for_testing(call_rows);
    const auto got = run_cp_on_gpu(c, g, {.backend = AttentionBackend::automatic});
    attention_cuda::cudnn::set_thd_group_call_rows_for_testing(std::nullopt);
    for (int r = 0; r < c.cp; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r) + ", call_rows " + std::to_string(call_rows));
      const Tensors& t = got[static_cast<size_t>(r)];
      auto f32 = [](const Tensor& x) { return raw::to(x, DType::f32); };
      EXPECT_TRUE(::cpf::testing::all_close(f32(t.out), shard(c, g, ref.out, 0, r), tol, tol)) << "out";
      EXPECT_TRUE(::cpf::testing::all_close(f32(t.lse), shard(c, g, ref.lse, 1, r), tol, tol)) << "lse";
      EXPECT_TRUE(::cpf::testing::all_close(f32(t.dq), shard(c, g, ref.dq, 0, r), tol, tol)) << "dq";
      EXPECT_TRUE(::cpf::testing::all_close(f32(t.dk), shard(c, g, ref.dk, 0, r), tol, tol)) << "dk";
      EXPECT_TRUE(::cpf::testing::all_close(f32(t.dv), shard(c, g, ref.dv, 0, r), tol, tol)) << "dv";
    }
  }
}

class CpMergeOnGpu : public ::cpf::testing::CudaTest {};

// The ring's (out, lse) merge on the device equals the host loop, rows that saw no key included.
TEST_F(CpMergeOnGpu, MatchesTheHostMerge) {
  const int64_t tokens = 6, heads = 2, dim = 3;
  PartialMerge host(tokens, heads, dim, DType::f32);
  PartialMerge device(tokens, heads, dim, DType::f32, Device::cuda(0));
  for (uint64_t part = 0; part < 3; ++part) {
    Tensor out = ::cpf::testing::random_tensor({tokens, heads, dim}, DType::f32, 10 + part);
    std::vector<float> lse = ::cpf::testing::random_tensor({heads, tokens}, DType::f32, 20 + part).to_vector<float>();
    // Part p sees no key for tokens p and p + 3 (and out is 0 there, as the kernels guarantee);
    // token 5 sees a key in no part at all.
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t t : {static_cast<int64_t>(part), static_cast<int64_t>(part) + 3, int64_t(5)}) {
        lse[static_cast<size_t>(h * tokens + t)] = -INFINITY;
        raw::fill_(raw::select(raw::select(out, 0, t), 0, h), 0.0);
      }
    }
    const Tensor lse_t = from_vector(lse, {heads, tokens});
    host.add(out, lse_t);
    device.add(raw::to(out, Device::cuda(0)), raw::to(lse_t, Device::cuda(0)));
  }
  EXPECT_TRUE(::cpf::testing::all_close(raw::to(device.lse(), Device::cpu()), host.lse(), 1e-6, 1e-6)) << "lse";
  EXPECT_TRUE(
      ::cpf::testing::all_close(raw::to(device.out(DType::f32), Device::cpu()), host.out(DType::f32), 1e-6, 1e-6))
      << "out";
  EXPECT_EQ(raw::to(device.lse(), Device::cpu()).to_vector<float>()[5], -INFINITY) << "token 5 saw no key";
}

TEST_F(CpMergeOnGpu, RejectsPartsOnAnotherDevice) {
  PartialMerge merge(4, 2, 3, DType::f32);  // on the CPU
  EXPECT_CPF_ERROR(
      merge.add(zeros({4, 2, 3}, {.device = Device::cuda(0)}), full({2, 4}, 0.0, {.device = Device::cuda(0)})),
      "cp merge: partial out on cuda:0 and lse on cuda:0 but the accumulator is on cpu");
}

}  // namespace
}  // namespace cpf::cp::testing
