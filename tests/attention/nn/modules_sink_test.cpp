// The attention modules with `attention_sink`: the "sinks" parameter, the forward against a hand
// composition with the sink oracle, f64 gradchecks through every parameter (sinks included), and
// under context parallelism (thread ranks, every strategy) the same output and the same gradient of
// every parameter as one rank once the ranks' gradients are summed (what the trainer's all-reduce does).
#include <gtest/gtest.h>

#include <mutex>

#include "attention/cp/sharding.h"
#include "attention/nn/attention_layout.h"
#include "attention/nn/multi_head_attention.h"
#include "attention/nn/multi_head_latent_attention.h"
#include "framework/autograd/ops.h"
#include "framework/distributed/device_mesh.h"
#include "framework/distributed/launcher.h"
#include "framework/tensor/ops/copy.h"
#include "support/gradcheck_utils.h"
#include "tests/attention/attention_support.h"
#include "tests/attention/nn/module_parameters.h"

namespace cpf {
namespace {

using nn::MultiHeadAttention;
using nn::MultiHeadAttentionOptions;
using nn::MultiHeadLatentAttention;
using testing::all_close;
using testing::random_tensor;
using Inputs = std::vector<Tensor>;
using nn::NamedTensor;

using testing::linear;
using testing::param;

using testing::with_parameters;

TEST(AttentionModulesSink, SinksParameterAndHandComposition) {
  Generator gen(3);
  const MultiHeadAttention mha({.hidden_size = 12,
                                .num_heads = 4,
                                .num_kv_heads = 2,
                                .head_dim = 4,
                                .rope = false,
                                .dtype = DType::f64,
                                .attention_sink = true},
                               &gen);
  const Tensor sinks = param(mha, "sinks");
  ASSERT_EQ(sinks.shape(), (Shape{4}));
  EXPECT_EQ(sinks.dtype(), DType::f64);
  EXPECT_TRUE(all_close(sinks, zeros({4}, {.dtype = DType::f64}), 0, 0)) << "sinks start at zero";
  raw::copy_(sinks, random_tensor({4}, DType::f64, 9, -2, 2));  // in place: the module's spec follows
  const Tensor x = random_tensor({2, 5, 12}, DType::f64, 1);
  auto heads = [](const Tensor& t, int64_t h) { return reshape(t, {2, 5, h, 4}); };
  const Tensor q = heads(linear(mha, "q_proj", x), 4), k = heads(linear(mha, "k_proj", x), 2);
  const Tensor v = heads(linear(mha, "v_proj", x), 2);
  AttentionSpec plain = mha.spec();
  plain.sink = Tensor();
  const Tensor attn = testing::naive_attention_with_sink(q, k, v, plain, std::nullopt, sinks).out;
  const Tensor want = linear(mha, "o_proj", reshape(attn, {2, 5, 16}));
  EXPECT_TRUE(all_close(mha.forward(x), want, 1e-12, 1e-12));
  const MultiHeadAttention bf16({.hidden_size = 8, .num_heads = 2, .dtype = DType::bf16, .attention_sink = true});
  EXPECT_EQ(param(bf16, "sinks").dtype(), DType::f32) << "the kernels take an f32 sink with bf16 inputs";
}

TEST(AttentionModulesSink, GradcheckMultiHeadAttentionWithSinks) {
  Generator gen(1);
  const MultiHeadAttention mha({.hidden_size = 6,
                                .num_heads = 4,
                                .num_kv_heads = 2,
                                .head_dim = 2,
                                .window = {2, 0},
                                .dtype = DType::f64,
                                .attention_sink = true},
                               &gen);
  raw::copy_(param(mha, "sinks"), random_tensor({4}, DType::f64, 4, -1, 1));
  const Tensor x = testing::grad_input({2, 4, 6}, 2);
  EXPECT_GRADCHECK([&](const Inputs& in) { return mha.forward(in[0]); }, with_parameters(x, mha));
}

TEST(AttentionModulesSink, GradcheckMultiHeadLatentAttentionWithSinks) {
  Generator gen(5);
  const MultiHeadLatentAttention mla({.hidden_size = 5,
                                      .num_heads = 2,
                                      .kv_lora_rank = 3,
                                      .qk_nope_head_dim = 2,
                                      .qk_rope_head_dim = 2,
                                      .v_head_dim = 3,
                                      .qkv_format = QkvFormat::thd,
                                      .mask = MaskType::padding_causal,
                                      .dtype = DType::f64,
                                      .attention_sink = true},
                                     &gen);
  ASSERT_EQ(param(mla, "sinks").shape(), (Shape{2}));
  raw::copy_(param(mla, "sinks"), random_tensor({2}, DType::f64, 6, -1, 1));
  const SequenceInfo seq = SequenceInfo::from_cu_seqlens({0, 3, 5}, {0, 4, 7});
  const Tensor x = testing::grad_input({7, 5}, 7);
  EXPECT_GRADCHECK([&](const Inputs& in) { return mla.forward(in[0], seq); }, with_parameters(x, mla));
}

// One module's output and every parameter gradient (f64, thd, causal, windowed) on one rank.
struct ModuleRun {
  Tensor out;
  std::vector<NamedTensor> grads;
};

std::shared_ptr<MultiHeadAttention> make_mha() {
  Generator gen(11);
  auto mha = std::make_shared<MultiHeadAttention>(MultiHeadAttentionOptions{.hidden_size = 8,
                                                                            .num_heads = 4,
                                                                            .num_kv_heads = 2,
                                                                            .head_dim = 2,
                                                                            .qkv_format = QkvFormat::thd,
                                                                            .mask = MaskType::padding_causal,
                                                                            .window = {5, 0},
                                                                            .dtype = DType::f64,
                                                                            .attention_sink = true},
                                                  &gen);
  raw::copy_(param(*mha, "sinks"), random_tensor({4}, DType::f64, 12, -2, 2));
  return mha;
}

std::vector<NamedTensor> grads_of(const nn::Module& m) {
  std::vector<NamedTensor> grads;
  for (const auto& [n, t] : m.named_parameters()) grads.emplace_back(n, t.grad());
  return grads;
}

TEST(AttentionModulesSink, ContextParallelEqualsOneRankForEveryStrategy) {
  const std::vector<int64_t> cu{0, 11, 16}, cu_padded = cp::pad_cu_seqlens(cu, 2);
  const SequenceInfo seq = SequenceInfo::from_cu_seqlens(cu, cu_padded);
  const Tensor x = random_tensor({cu_padded.back(), 8}, DType::f64, 13);
  const Tensor dy = random_tensor({cu_padded.back(), 8}, DType::f64, 14);
  const auto single = make_mha();
  Tensor xs = raw::clone(x).set_requires_grad();
  const Tensor y = single->forward(xs, seq);
  backward({y}, {dy});
  const std::vector<NamedTensor> want = grads_of(*single);
  for (cp::CommType comm : {cp::CommType::p2p, cp::CommType::all_gather, cp::CommType::a2a}) {
    SCOPED_TRACE(cp::comm_type_name(comm));
    std::vector<std::vector<NamedTensor>> rank_grads(2);
    dist::launch(2, [&](dist::RankContext& rc) {
      dist::MeshShape shape;
      shape.cp = 2;
      shape.require_cp = true;
      dist::DeviceMesh mesh(rc.world, shape);
      const cp::ContextParallel cp{comm, mesh.cp()};
      const cp::ThdShard shard = cp::thd_shard(cu, cu_padded, 2, rc.rank);
      const auto mha = make_mha();
      const Tensor local_y = mha->forward(cp::shard_tokens(x, shard), seq, &cp);
      EXPECT_TRUE(all_close(local_y, cp::shard_tokens(y.detach(), shard), 1e-10, 1e-10)) << "rank " << rc.rank;
      backward({local_y}, {cp::shard_tokens(dy, shard)});
      rank_grads[rc.rank] = grads_of(*mha);
    });
    for (size_t i = 0; i < want.size(); ++i) {
      const Tensor sum = raw::binary(raw::BinaryOp::add, rank_grads[0][i].second, rank_grads[1][i].second);
      EXPECT_TRUE(all_close(sum, want[i].second, 1e-10, 1e-10)) << want[i].first << " summed over the CP ranks";
    }
  }
}

// What a module hands CP attention: the sink's values unchanged, 1/cp of its gradient (CP attention returns
// the group's whole d(sink) on every rank; the trainer sums the parameter's gradient over the world).
TEST(ModulesSink, TheCpSinkKeepsItsValuesAndScalesItsGradient) {
  Tensor sink = from_vector<double>({0.5, -1.25, 3.0}, {3}).set_requires_grad();
  const Tensor handed = nn::cp_sink(sink, 4);
  EXPECT_EQ(handed.to_vector<double>(), sink.to_vector<double>());
  backward(sum(mul(handed, from_vector<double>({1.0, 2.0, 4.0}, {3}))));
  EXPECT_EQ(sink.grad().to_vector<double>(), (std::vector<double>{0.25, 0.5, 1.0}));
  EXPECT_TRUE(nn::cp_sink(sink, 1).is_same(sink));
  EXPECT_FALSE(nn::cp_sink(Tensor(), 2).defined());
  EXPECT_CPF_ERROR(nn::cp_sink(sink, 0), "cp_sink: cp_size=0 must be at least 1");
}

}  // namespace
}  // namespace cpf
