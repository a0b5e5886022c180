// MLA under context parallelism over NCCL with attention.cp_mla_latent: auto (the default): an MLA
// attention module (attention/nn/multi_head_latent_attention.h) on 2 ranks (rank r on cuda:r,
// p2p and all_gather) logs the choice cp::choose_mla_latent makes at the CUDA rates for its shape and
// tokens per rank ("cp_mla_latent auto (p2p, cuda:0): the latent travels (...)"), and every rank's output
// equals its shard of the same module's output on cuda:0 without CP, every parameter gradient summed
// over the ranks equals the single-GPU gradient (f32: the two sides differ in summation order only).
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "attention/cp/context_parallel.h"
#include "attention/cp/latent_kv.h"
#include "attention/cp/sharding.h"
#include "attention/nn/multi_head_latent_attention.h"
#include "framework/autograd/ops.h"
#include "framework/core/logging.h"
#include "framework/distributed/device_mesh.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"
#include "tests/distributed/nccl/nccl_test_utils.h"

namespace cpf::cp {
namespace {

using ::cpf::testing::matches;
using ::cpf::testing::random_cpu;
using nn::MultiHeadLatentAttention;

// 8 heads over a 32-value latent: the latent (32 + 16 per token) is 8x smaller than K/V (8 x 48), and 78
// tokens per rank hide little of a transfer, so auto moves it at the default CUDA rates (asserted below,
// so the test runs the latent path).
const nn::MultiHeadLatentAttentionOptions kOptions{.hidden_size = 64,
                                                   .num_heads = 8,
                                                   .kv_lora_rank = 32,
                                                   .qk_nope_head_dim = 16,
                                                   .qk_rope_head_dim = 16,
                                                   .v_head_dim = 16,
                                                   .qkv_format = QkvFormat::thd,
                                                   .mask = MaskType::causal,
                                                   .init_std = 0.1};
const MlaLatentShape kShape{
    .num_heads = 8, .kv_lora_rank = 32, .qk_nope_head_dim = 16, .qk_rope_head_dim = 16, .v_head_dim = 16};

std::shared_ptr<MultiHeadLatentAttention> make_mla(const Device& device) {
  Generator gen(31);
  auto mla = std::make_shared<MultiHeadLatentAttention>(kOptions, &gen);
  mla->to(device);
  return mla;
}

std::map<std::string, Tensor> host_grads(const nn::Module& m) {
  std::map<std::string, Tensor> grads;
  for (const auto& [name, p] : m.named_parameters()) {
    grads[name] = raw::to(p.grad().defined() ? p.grad() : zeros_like(p), Device::cpu());
  }
  return grads;
}

class CpMlaLatentNccl : public ::cpf::testing::MultiGpuTest, public ::testing::WithParamInterface<CommType> {};

TEST_P(CpMlaLatentNccl, AutoLogsItsChoiceAndEqualsOneGpu) {
  const CommType comm = GetParam();
  const int cp_size = 2;
  // Two sequences (57 and 94 tokens) padded to multiples of 2 cp.
  const std::vector<int64_t> cu{0, 57, 151}, cu_padded = pad_cu_seqlens(cu, cp_size);
  const SequenceInfo seq = SequenceInfo::from_cu_seqlens(cu, cu_padded);
  // The rule's choice for this call (f32 at the CUDA rates), as the module computes it.
  const int64_t tokens = cu_padded.back() / cp_size;
  const MlaLatentCall call{.ring = comm == CommType::p2p,
                           .ranks = cp_size,
                           .tokens_per_rank = tokens,
                           .tile_pairs = mla_tile_pairs(seq, tokens, 1, cp_size),
                           .element_bytes = 4};
  const MlaLatentChoice expected = choose_mla_latent(kShape, call, mla_latent_rates(Device::cuda(0), DType::f32));
  // At the default link rate a few hundred tokens per rank are communication-bound: the latent path runs.
  if (std::getenv("CPF_CP_LINK_GBPS") == nullptr) EXPECT_TRUE(expected.latent) << expected.why;
  const Tensor x = random_cpu({cu_padded.back(), 64}, DType::f32, 41);   // (T, C)
  const Tensor dy = random_cpu({cu_padded.back(), 64}, DType::f32, 42);  // (T, C)

  const auto single = make_mla(Device::cuda(0));
  const Tensor y = single->forward(raw::to(x, Device::cuda(0)), seq);
  backward({y}, {raw::to(dy, Device::cuda(0))});
  const Tensor y_host = raw::to(y.detach(), Device::cpu());
  const std::map<std::string, Tensor> want = host_grads(*single);

  set_log_level(LogLevel::info);
  std::vector<std::map<std::string, Tensor>> rank_grads(cp_size);
  std::vector<Tensor> outputs(cp_size);
  std::mutex mutex;
  ::testing::internal::CaptureStderr();
  try {
    ::cpf::testing::run_nccl(cp_size, [&](dist::RankContext& rc) {
      dist::DeviceMesh mesh(rc.world, {.cp = cp_size, .require_cp = true});
      const ContextParallel cp{comm, mesh.cp()};  // mla_latent: automatic, the default
      EXPECT_EQ(cp.mla_latent, MlaLatentMode::automatic);
      const ThdShard shard = thd_shard(cu, cu_padded, cp_size, rc.rank);
      const auto mla = make_mla(rc.device);
      const Tensor local = mla->forward(raw::to(shard_tokens(x, shard), rc.device), seq, &cp);  // (T / cp, C)
      backward({local}, {raw::to(shard_tokens(dy, shard), rc.device)});
      std::lock_guard<std::mutex> lock(mutex);
      outputs[static_cast<size_t>(rc.rank)] = raw::to(local.detach(), Device::cpu());
      rank_grads[static_cast<size_t>(rc.rank)] = host_grads(*mla);
    });
  } catch (const Error& e) {
    ::testing::internal::GetCapturedStderr();
    FAIL() << comm_type_name(comm) << " over NCCL failed: " << e.what();
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  for (int r = 0; r < cp_size; ++r) {
    const std::string line = "cp_mla_latent auto (" + comm_type_name(comm) + ", cuda:" + std::to_string(r) +
                             "): " + (expected.latent ? "the latent travels" : "expanded K/V travel");
    EXPECT_NE(log.find(line), std::string::npos) << "no line '" << line << "' in stderr:\n" << log;
  }
  for (int r = 0; r < cp_size; ++r) {
    const Tensor want_shard = shard_tokens(y_host, thd_shard(cu, cu_padded, cp_size, r));
    EXPECT_TRUE(matches(outputs[static_cast<size_t>(r)], want_shard, 1e-5)) << "output of rank " << r;
  }
  for (const auto& [name, g] : want) {
    Tensor sum = zeros_like(g);
    for (const auto& rank : rank_grads) sum = raw::binary(raw::BinaryOp::add, sum, rank.at(name));
    EXPECT_TRUE(matches(sum, g, 1e-5)) << name << " summed over the ranks";
  }
}

INSTANTIATE_TEST_SUITE_P(Strategies, CpMlaLatentNccl, ::testing::Values(CommType::p2p, CommType::all_gather),
                         [](const auto& info) {
                           return comm_type_name(info.param) == "p2p" ? std::string("p2p") : std::string("all_gather");
                         });

}  // namespace
}  // namespace cpf::cp
