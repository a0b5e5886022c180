// The GPT under context parallelism: every rank's logits on its dual-chunk shard, and the parameter
// gradients summed over the CP group, equal the single-rank model on the whole packed batch, for each
// CP strategy and each attention type (this exercises the attention modules' CP hook: global RoPE
// positions on the shard, and context_parallel_attention).
#include <gtest/gtest.h>

#include <mutex>

#include "framework/autograd/ops.h"
#include "framework/distributed/device_mesh.h"
#include "framework/distributed/launcher.h"
#include "models/data/cp_shard.h"
#include "models/data/data_loader.h"
#include "models/gpt.h"
#include "models/gpt_input.h"
#include "models/gpt_test_options.h"
#include "support/test_utils.h"

namespace cpf::models {
namespace {

using testing::all_close;

GPTOptions options(AttentionType attention, PositionType positions) {
  GPTOptions o = small_f64_gpt(attention);
  o.positions = positions;
  o.max_positions = 32;
  o.tie_embeddings = positions == PositionType::rope;
  o.mlp = nn::Activation::swiglu;
  return o;
}

models::data::Batch packed_batch() { return packed_addition_batches(1).front(); }

struct Reference {
  Tensor logits;  // (T, V) of the global batch
  std::map<std::string, Tensor> grads;
};

Reference single_rank(const GPTOptions& o, const models::data::Batch& batch) {
  Generator gen(3);
  GPT model(o, &gen);
  const GPTBatch b = make_gpt_batch(models::data::shard_for_rank(batch, 1, 0));
  Reference r;
  r.logits = model.forward(b.input);
  backward(GPT::loss(r.logits, b.labels, b.num_valid_labels));
  for (const auto& [name, p] : model.named_parameters()) r.grads[name] = p.grad();
  return r;
}

void expect_cp_matches(const GPTOptions& o, cp::CommType comm, int cp_size) {
  const models::data::Batch batch = packed_batch();
  const Reference ref = single_rank(o, batch);
  const std::string what = cp::comm_type_name(comm) + " cp=" + std::to_string(cp_size);
  std::mutex mu;
  dist::launch(cp_size, [&](dist::RankContext& ctx) {
    const bool hierarchical = comm == cp::CommType::a2a_p2p;
    dist::DeviceMesh mesh(ctx.world,
                          {.dp = 1, .cp = cp_size, .cp_a2a = hierarchical ? 2 : 0, .hierarchical_cp = hierarchical});
    const cp::ContextParallel cp{comm, mesh.cp(), mesh.cp_a2a(), mesh.cp_p2p()};
    Generator gen(3);
    GPT model(o, &gen);
    const models::data::LocalBatch local = models::data::shard_for_rank(batch, cp_size, ctx.rank);
    const GPTBatch b = make_gpt_batch(local);
    const Tensor logits = model.forward(b.input, &cp);
    backward(GPT::loss(logits, b.labels, b.global_num_valid_labels));
    const Tensor expected = index_select(
        ref.logits, 0, from_vector(local.thd.global_index, {static_cast<int64_t>(local.thd.global_index.size())}));
    std::map<std::string, Tensor> summed;
    for (const auto& [name, p] : model.named_parameters()) summed[name] = ctx.world->all_reduce(p.grad());
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_TRUE(all_close(logits, expected, 1e-10, 1e-8)) << what << " rank " << ctx.rank;
    for (const auto& [name, g] : summed)
      EXPECT_TRUE(all_close(g, ref.grads.at(name), 1e-10, 1e-7)) << what << " " << name;
  });
}

TEST(GPTContextParallel, EveryStrategyMatchesOneRank) {
  const GPTOptions o = options(AttentionType::mha, PositionType::rope);
  expect_cp_matches(o, cp::CommType::p2p, 2);
  expect_cp_matches(o, cp::CommType::all_gather, 2);
  expect_cp_matches(o, cp::CommType::a2a, 2);
  expect_cp_matches(o, cp::CommType::a2a_p2p, 4);
}

TEST(GPTContextParallel, GqaMlaAndLearnedPositions) {
  expect_cp_matches(options(AttentionType::gqa, PositionType::rope), cp::CommType::p2p, 2);
  expect_cp_matches(options(AttentionType::gqa, PositionType::rope), cp::CommType::a2a, 2);
  expect_cp_matches(options(AttentionType::mla, PositionType::rope), cp::CommType::p2p, 2);
  expect_cp_matches(options(AttentionType::mla, PositionType::rope), cp::CommType::all_gather, 2);
  expect_cp_matches(options(AttentionType::mha, PositionType::learned), cp::CommType::p2p, 2);
}

// model.attention_sink: the blocks' "attn.sinks" gradients summed over the ranks equal one rank's.
TEST(GPTContextParallel, AttentionSinksMatchOneRank) {
  GPTOptions gqa = options(AttentionType::gqa, PositionType::rope);
  gqa.attention_sink = true;
  gqa.window = 5;
  expect_cp_matches(gqa, cp::CommType::p2p, 2);
  expect_cp_matches(gqa, cp::CommType::a2a, 2);
  expect_cp_matches(gqa, cp::CommType::a2a_p2p, 4);
  GPTOptions mla = options(AttentionType::mla, PositionType::rope);
  mla.attention_sink = true;
  expect_cp_matches(mla, cp::CommType::all_gather, 2);
  Generator gen(3);
  const GPT model(mla, &gen);
  int sinks = 0;
  for (const auto& [name, p] : model.named_parameters()) sinks += name.ends_with(".attn.sinks") ? 1 : 0;
  EXPECT_EQ(sinks, mla.num_layers);
}

TEST(GPTContextParallel, ShardedInputMustMatchTheGlobalSequenceInfo) {
  const models::data::Batch batch = packed_batch();
  dist::launch(2, [&](dist::RankContext& ctx) {
    const cp::ContextParallel cp{cp::CommType::p2p, ctx.world, nullptr, nullptr};
    GPT model(options(AttentionType::mha, PositionType::rope));
    GPTBatch b = make_gpt_batch(models::data::shard_for_rank(batch, 2, ctx.rank));
    b.input.seq = SequenceInfo::from_lengths({static_cast<int64_t>(b.input.tokens.size(0))});  // a local description
    EXPECT_CPF_ERROR(model.forward(b.input, &cp),
                     "GPT: the sequence info covers 32 storage tokens but the batch has 32 "
                     "tokens per rank x cp 2");
  });
}

TEST(GPTContextParallel, SpecHeadCountsMustDescribeTheShards) {
  dist::launch(2, [&](dist::RankContext& ctx) {
    const cp::ContextParallel cp{cp::CommType::a2a, ctx.world, nullptr, nullptr};
    const Tensor q = zeros({2, 8, 4, 4});  // (B, S_local, H, D)
    AttentionSpec spec{.qkv_format = QkvFormat::bshd, .mask = MaskType::causal, .num_heads = 3};
    EXPECT_CPF_ERROR(cp::context_parallel_attention(cp::dual_chunk_of(q, cp), cp::dual_chunk_of(q, cp),
                                                    cp::dual_chunk_of(q, cp), spec, std::nullopt, cp),
                     "context parallel: the spec (");
    EXPECT_CPF_ERROR(cp::context_parallel_attention(cp::dual_chunk_of(q, cp), cp::dual_chunk_of(q, cp),
                                                    cp::dual_chunk_of(q, cp), spec, std::nullopt, cp),
                     "does not match q=[2,8,4,4]");
  });
}

}  // namespace
}  // namespace cpf::models
