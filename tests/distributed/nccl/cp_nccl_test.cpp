// Context parallelism over NCCL: every CP strategy with one rank per GPU (dist::launch with
// Backend::nccl, rank r on cuda:r) against the single-GPU result of the same inputs on cuda:0.
//
//   2 GPUs: p2p, all_gather, a2a at cp = 2
//   4 GPUs: p2p, all_gather, a2a at cp = 4, and a2a+p2p as 2 (a2a) x 2 (p2p)
//
// Per strategy one NCCL world runs 16 cases in a row (one world and one DeviceMesh, as a trainer
// would): bshd and thd, no_mask and causal, MHA (8/8 heads) and GQA (8/2: at cp = 4 a2a the KV heads
// are fewer than the group and get replicated), each in
//   f32, attention.backend unfused, backward from out and lse: every element within the CPU CP
//        equivalence tolerance |a - b| <= 2e-6 + 1e-5 |b| (the two sides differ only in summation order);
//   bf16, attention.backend auto (cuDNN), backward from out only (what a model does; a gradient on lse
//        would send the backward to the unfused path): max |a - b| / max |ref| <= 2.5e-2 (MHA) or
//        3.5e-2 (GQA), TransformerEngine's CP tolerances, for out, dq, dk, dv; lse (f32 on both sides)
//        within 1e-4 of max |lse|.
// The reference is dot_product_attention on cuda:0 with the same AttentionKernelConfig over the whole sequence;
// each rank's out, lse, dq, dk, dv are compared with its dual-chunk shard of it (padding included:
// the attention contract makes it exact zeros and -inf on both sides). A failure names the strategy,
// case, rank, tensor, the error against its bound and the worst element with its (token, head, dim)
// and the token's global position; every case prints its largest errors, a record of the margins.
// Attention sinks: the causal GQA cases run once more with a sink (spec.sink, f32 per query head); every
// rank's d(sink) must equal the single-GPU d(sink) within the case's bound (f32: 1e-4 relative).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "attention/cp/cp_support.h"
#include "framework/distributed/device_mesh.h"
#include "tests/attention/cp/cp_harness.h"
#include "tests/distributed/nccl/nccl_test_utils.h"

namespace cpf::cp::testing {
namespace {

struct Strategy {
  CommType comm;
  int cp;
  int a2a;              // a2a+p2p: the a2a sub-group size
  int head_groups = 0;  // a2a, a2a+p2p: ContextParallel::a2a_head_groups (0 = automatic)
};

struct HeadCase {
  const char* name;
  int64_t heads, kv_heads;
};

const HeadCase kHeads[] = {{"mha", 8, 8}, {"gqa", 8, 2}};

// One problem of a strategy's run.
struct Case {
  std::string name;
  CpCase c;
  DType dtype = DType::f32;
  AttentionBackend backend = AttentionBackend::unfused;
  bool lse_gradient = true;  // backward from (out, lse) or from out alone
  bool sink = false;         // with an attention sink (CpCase::sink)
  Global global;             // in `dtype` (bf16: the f32 draw rounded once)
  Tensors reference;         // the single-GPU result, on the CPU
};

std::string strategy_name(const Strategy& s) {
  std::string name = comm_type_name(s.comm) + "_cp" + std::to_string(s.cp);
  std::replace(name.begin(), name.end(), '+', '_');
  if (s.head_groups > 0) name += "_g" + std::to_string(s.head_groups);
  return name;
}

Global in_dtype(const Global& g, DType dtype) {
  Global r = g;
  r.q = raw::to(g.q, dtype);
  r.k = raw::to(g.k, dtype);
  r.v = raw::to(g.v, dtype);
  r.dout = raw::to(g.dout, dtype);
  return r;  // dlse stays f32: lse is f32 for bf16 inputs
}

int64_t lse_dim(const CpCase& c) { return c.format == QkvFormat::thd ? 1 : 2; }

// The whole problem on `device` with one dot_product_attention call; results on the CPU.
Tensors single_device_result(const Case& k, Device device) {
  const Global& g = k.global;
  auto put = [&](const Tensor& t) { return raw::to(t, device); };
  Tensor q = put(g.q), kk = put(g.k), v = put(g.v);
  q.set_requires_grad();
  kk.set_requires_grad();
  v.set_requires_grad();
  AttentionSpec spec = spec_of(k.c);
  if (g.sink.defined()) spec.sink = put(g.sink).set_requires_grad();
  auto [out, lse] = dot_product_attention(q, kk, v, spec, g.seq, {.backend = k.backend});
  if (k.lse_gradient) {
    backward({out, lse}, {put(g.dout), put(g.dlse)});
  } else {
    backward({out}, {put(g.dout)});
  }
  auto host = [](const Tensor& t) { return raw::to(t.detach(), Device::cpu()); };
  return {host(out),       host(lse),      host(q.grad()),
          host(kk.grad()), host(v.grad()), spec.sink.defined() ? host(spec.sink.grad()) : Tensor()};
}

std::vector<Case> cases_of(const Strategy& s, Device reference_device) {
  std::vector<Case> cases;
  for (QkvFormat format : {QkvFormat::bshd, QkvFormat::thd}) {
    for (MaskType mask : {MaskType::no_mask, MaskType::causal}) {
      for (const HeadCase& heads : kHeads) {
        // (dtype, with a sink): the sink only joins the causal GQA cases.
        for (const auto& [dtype, sink] : {std::pair{DType::f32, false}, std::pair{DType::bf16, false},
                                          std::pair{DType::f32, true}, std::pair{DType::bf16, true}}) {
          if (sink && (mask != MaskType::causal || heads.kv_heads == heads.heads)) continue;
          if (s.head_groups > 1 && heads.kv_heads != heads.heads) continue;  // GQA leaves one KV head a rank
          Case k;
          k.sink = sink;
          CpCase& c = k.c;
          c.comm = s.comm;
          c.cp = s.cp;
          c.a2a = s.a2a;
          c.format = format;
          c.mask = mask;
          c.window = mask == MaskType::causal ? AttentionWindow{-1, 0} : AttentionWindow{};
          c.heads = heads.heads;
          c.kv_heads = heads.kv_heads;
          c.d_qk = c.d_v = 64;  // a multiple of 8: cuDNN takes the bf16 calls
          c.batch = 2;
          c.seq = 80 * s.cp;  // 2 cp chunks of 40 tokens per rank
          // Padded to multiples of 2 cp; the 3-token sequence leaves whole chunks of some ranks empty.
          c.thd_lengths = {37, 133, 3, 200};
          c.dtype = DType::f32;  // drawn in f32; bf16 cases round it once
          c.seed = 100 + cases.size();
          c.sink = sink;
          k.dtype = dtype;
          k.backend = dtype == DType::f32 ? AttentionBackend::unfused : AttentionBackend::automatic;
          k.lse_gradient = dtype == DType::f32;
          std::ostringstream name;
          name << qkv_format_name(format) << "_" << mask_type_name(mask) << "_" << heads.name << "_"
               << dtype_name(dtype) << "_" << attention_backend_name(k.backend);
          if (sink) name << "_sink";
          k.name = name.str();
          const CpQuery query{c.comm,  c.cp,       c.a2a,  c.format, c.mask, c.window,
                              c.heads, c.kv_heads, c.d_qk, c.d_v,    false};
          if (const auto reason = unsupported_reason(query))
            ADD_FAILURE() << k.name << ": the strategy rejects it: " << *reason;
          k.global = in_dtype(make_global(c), dtype);
          k.reference = single_device_result(k, reference_device);
          cases.push_back(std::move(k));
        }
      }
    }
  }
  return cases;
}

// Runs every case on the ranks of `options` (one world, one mesh); results[case][rank] on the CPU.
std::vector<std::vector<Tensors>> run_on_ranks(const Strategy& s, const std::vector<Case>& cases,
                                               const dist::LaunchOptions& options) {
  std::vector<std::vector<Tensors>> results(cases.size(), std::vector<Tensors>(static_cast<size_t>(s.cp)));
  dist::launch(
      s.cp,
      [&](dist::RankContext& rc) {
        dist::MeshShape shape;
        shape.cp = s.cp;
        shape.require_cp = true;
        if (s.comm == CommType::a2a_p2p) {
          shape.cp_a2a = s.a2a;
          shape.hierarchical_cp = true;
        }
        dist::DeviceMesh mesh(rc.world, shape);
        const int r = rc.rank;
        for (size_t i = 0; i < cases.size(); ++i) {
          const Case& k = cases[i];
          const Global& g = k.global;
          try {
            ContextParallel cp{s.comm, mesh.cp(), mesh.cp_a2a(), mesh.cp_p2p(), {.backend = k.backend}};
            cp.a2a_head_groups = s.head_groups;  // pipelined Ulysses: several all-to-alls in flight on NCCL
            auto put = [&](const Tensor& t, int64_t dim) { return raw::to(shard(k.c, g, t, dim, r), rc.device); };
            Tensor q = put(g.q, g.seq_dim), kk = put(g.k, g.seq_dim), v = put(g.v, g.seq_dim);
            q.set_requires_grad();
            kk.set_requires_grad();
            v.set_requires_grad();
            AttentionSpec spec = spec_of(k.c);
            if (g.sink.defined()) spec.sink = raw::to(g.sink, rc.device).set_requires_grad();
            auto [out, lse] = context_parallel_attention(dual_chunk_of(q, cp), dual_chunk_of(kk, cp),
                                                         dual_chunk_of(v, cp), spec, g.seq, cp);
            if (k.lse_gradient) {
              backward({out, lse}, {put(g.dout, g.seq_dim), put(g.dlse, lse_dim(k.c))});
            } else {
              backward({out}, {put(g.dout, g.seq_dim)});
            }
            auto host = [](const Tensor& t) { return raw::to(t.detach(), Device::cpu()); };
            results[i][static_cast<size_t>(r)] = {
                host(out),       host(lse),      host(q.grad()),
                host(kk.grad()), host(v.grad()), spec.sink.defined() ? host(spec.sink.grad()) : Tensor()};
            // Progress, so a run that stops names the case it stopped in.
            std::fprintf(stderr, "[cp nccl] %s rank %d finished case %zu of %zu (%s)\n", strategy_name(s).c_str(), r,
                         i + 1, cases.size(), k.name.c_str());
          } catch (const std::exception& e) {
            CPF_FAIL("case ", k.name, " on rank ", r, " (", rc.device.str(), "): ", e.what());
          }
        }
      },
      options);
  return results;
}

// "(token 17, head 3, dim 5), global position 97" for flat index `i` of a rank's shard of `what`.
std::string locate(const Case& k, int rank, const Tensor& t, const std::string& what, int64_t i) {
  std::vector<int64_t> idx(t.shape().size());
  for (int64_t d = static_cast<int64_t>(idx.size()) - 1, rest = i; d >= 0; --d) {
    idx[static_cast<size_t>(d)] = rest % t.shape()[static_cast<size_t>(d)];
    rest /= t.shape()[static_cast<size_t>(d)];
  }
  std::ostringstream os;
  os << "index " << shape_str(idx);
  const bool thd = k.c.format == QkvFormat::thd;
  const int64_t token = what == "lse" ? idx.back() : idx[thd ? 0 : 1];
  if (thd) {
    const ThdShard info = thd_shard(k.global.cu, k.global.cu_padded, k.c.cp, rank);
    const size_t t_i = static_cast<size_t>(token);
    os << " = local token " << token << " (sequence " << info.sequence[t_i] << ", position " << info.position[t_i]
       << (info.valid[t_i] ? "" : ", padding") << ")";
  } else {
    os << " = local token " << token << " at global position "
       << dual_chunk_positions(k.c.seq, k.c.cp, rank)[static_cast<size_t>(token)];
  }
  return os.str();
}

struct Check {
  double error = 0;  // the compared figure (see the file comment)
  double bound = 0;
  std::string failure;  // empty when within the bound
};

// f32: the element with the largest excess over atol + rtol |ref|. bf16: max |a - b| / max |ref| over
// the finite entries. Both: NaN fails; an infinity must be matched exactly.
Check compare(const Case& k, int rank, const std::string& what, const Tensor& got, const Tensor& want, double bound) {
  Check c;
  c.bound = bound;
  if (got.shape() != want.shape()) {
    c.failure = "shape " + shape_str(got.shape()) + " vs reference " + shape_str(want.shape());
    return c;
  }
  const auto a = raw::to(got, DType::f64).to_vector<double>();
  const auto b = want.to_vector<double>();
  const bool element_wise = k.dtype == DType::f32;
  double scale = 0, worst = -1;
  int64_t worst_i = -1;
  for (double x : b) scale = std::isfinite(x) ? std::max(scale, std::abs(x)) : scale;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isinf(a[i]) || std::isinf(b[i])) {
      if (a[i] == b[i]) continue;
      c.failure = "element " + locate(k, rank, got, what, static_cast<int64_t>(i)) + " is " + std::to_string(a[i]) +
                  ", reference " + std::to_string(b[i]);
      return c;
    }
    const double err = std::abs(a[i] - b[i]);
    const double excess = element_wise ? err / (2e-6 + 1e-5 * std::abs(b[i])) : err;
    if (excess > worst) {
      worst = excess;
      worst_i = static_cast<int64_t>(i);
    }
  }
  if (worst_i < 0) return c;
  const size_t w = static_cast<size_t>(worst_i);
  // f32: the worst ratio of error to its allowance (<= 1 passes); bf16: the normalised max error.
  c.error = element_wise ? worst : (scale > 0 ? worst / scale : worst);
  if (element_wise) c.bound = 1.0;
  if (c.error > c.bound) {
    std::ostringstream os;
    os << (element_wise ? "error / (2e-6 + 1e-5 |ref|) = " : "max |a - b| / max |ref| = ") << c.error << " > "
       << c.bound << "; worst at " << locate(k, rank, got, what, worst_i) << ": " << a[w] << " vs reference " << b[w]
       << " (max |ref| " << scale << ")";
    c.failure = os.str();
  }
  return c;
}

class CpNccl : public ::cpf::testing::MultiGpuTest, public ::testing::WithParamInterface<Strategy> {};

TEST_P(CpNccl, EveryRankShardEqualsTheSingleGpuResult) {
  const Strategy& s = GetParam();
  const int gpus = cuda::device_count();
  if (gpus < s.cp) {
    GTEST_SKIP() << strategy_name(s) << " needs " << s.cp << " GPUs, " << gpus
                 << " visible: it runs on the 4-GPU machine (nvidia-h200-x4)";
  }
  unsetenv("CPF_ATTENTION_BACKEND");  // each case's AttentionKernelConfig decides
  const std::vector<Case> cases = cases_of(s, Device::cuda(0));
  std::vector<std::vector<Tensors>> results;
  try {
    results = run_on_ranks(s, cases, {.timeout = std::chrono::seconds(120), .backend = dist::Backend::nccl});
  } catch (const Error& e) {
    FAIL() << strategy_name(s) << " over NCCL failed: " << e.what();
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& k = cases[i];
    const bool bf16 = k.dtype == DType::bf16;
    const double tol = bf16 ? (k.c.kv_heads == k.c.heads ? 2.5e-2 : 3.5e-2) : 0.0;  // f32: element-wise
    double worst[5] = {0, 0, 0, 0, 0};
    for (int r = 0; r < s.cp; ++r) {
      const Tensors& got = results[i][static_cast<size_t>(r)];
      const Tensors& ref = k.reference;
      const Global& g = k.global;
      const struct {
        const char* what;
        const Tensor& got;
        Tensor want;
        double bound;
      } items[] = {
          {"out", got.out, shard(k.c, g, ref.out, g.seq_dim, r), tol},
          {"lse", got.lse, shard(k.c, g, ref.lse, lse_dim(k.c), r), bf16 ? 1e-4 : 0.0},
          {"dq", got.dq, shard(k.c, g, ref.dq, g.seq_dim, r), tol},
          {"dk", got.dk, shard(k.c, g, ref.dk, g.seq_dim, r), tol},
          {"dv", got.dv, shard(k.c, g, ref.dv, g.seq_dim, r), tol},
      };
      for (size_t t = 0; t < 5; ++t) {
        const Check c = compare(k, r, items[t].what, items[t].got, items[t].want, items[t].bound);
        worst[t] = std::max(worst[t], c.error);
        EXPECT_TRUE(c.failure.empty()) << strategy_name(s) << " " << k.name << ", rank " << r << " of " << s.cp
                                       << " (cuda:" << r << "), " << items[t].what << ": " << c.failure;
      }
    }
    if (k.sink) {
      // d(sink): whole on every rank (CP attention sums the ranks' shares over the group).
      const auto want = raw::to(k.reference.dsink, DType::f64).to_vector<double>();
      for (int r = 0; r < s.cp; ++r) {
        const Tensor& d = results[i][static_cast<size_t>(r)].dsink;
        ASSERT_TRUE(d.defined()) << k.name << ": no d(sink) on rank " << r;
        const auto got = raw::to(d, DType::f64).to_vector<double>();
        double scale = 0, err = 0;
        for (size_t h = 0; h < want.size(); ++h) {
          scale = std::max(scale, std::abs(want[h]));
          err = std::max(err, std::abs(got[h] - want[h]));
        }
        const double bound = bf16 ? tol : 1e-4;
        EXPECT_LE(err, bound * scale) << strategy_name(s) << " " << k.name << ": d(sink) on rank " << r
                                      << ", max error " << err << " vs max |ref| " << scale;
      }
    }
    std::printf("[cp nccl] %-16s %-34s worst over ranks %s: out %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n",
                strategy_name(s).c_str(), k.name.c_str(), bf16 ? "(max err / max |ref|)" : "(error / allowance)",
                worst[0], worst[1], worst[2], worst[3], worst[4]);
  }
}

std::string param_name(const ::testing::TestParamInfo<Strategy>& info) { return strategy_name(info.param); }

INSTANTIATE_TEST_SUITE_P(EveryStrategy, CpNccl,
                         ::testing::Values(Strategy{CommType::p2p, 2, 1}, Strategy{CommType::all_gather, 2, 1},
                                           Strategy{CommType::a2a, 2, 1}, Strategy{CommType::p2p, 4, 1},
                                           Strategy{CommType::all_gather, 4, 1}, Strategy{CommType::a2a, 4, 1},
                                           Strategy{CommType::a2a_p2p, 4, 2}, Strategy{CommType::a2a, 2, 1, 2},
                                           Strategy{CommType::a2a, 4, 1, 2}, Strategy{CommType::a2a_p2p, 4, 2, 2}),
                         param_name);

}  // namespace
}  // namespace cpf::cp::testing
