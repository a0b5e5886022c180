// StepPrefetch (apps/trainer/step/step_prefetch.h) on two CPU thread ranks: a stop signal seen by one rank is
// agreed by every rank after the same step; the read-ahead leaves the loader's cursor at the next
// unconsumed batch, is taken only while that cursor has not moved and its count is known, and is read
// again otherwise; every rejected call, with its message.
#include <gtest/gtest.h>

#include <csignal>
#include <mutex>

#include "apps/trainer/step/grad_accumulation.h"
#include "apps/trainer/step/step_prefetch.h"
#include "framework/distributed/launcher.h"
#include "tests/apps/addition_batches.h"
#include "tests/support/test_utils.h"

namespace cpf::trainer {
namespace {

models::data::DataOptions batch_options() { return cpf::testing::addition_batches(); }

RankGroups groups_of(dist::RankContext& ctx) {
  RankGroups g;
  g.world = ctx.world;
  g.dp_rank = ctx.rank;
  g.dp_size = ctx.world->size();
  return g;
}

// Each rank thread's own stop flag (the trainer's is the process's pending_stop_signal()).
thread_local int t_signal = 0;
int rank_signal() { return t_signal; }
int no_signal() { return 0; }

// One step's worth of the prefetch's part: read ahead, then complete with the values read back.
void read_ahead_and_complete(StepPrefetch& p, models::data::DataLoader& loader, int64_t accum, const RankGroups& g) {
  const std::vector<Tensor> v = p.read_ahead(loader, accum, g, Device::cpu());
  ASSERT_EQ(v.size(), 2u);
  p.complete(v[0].item<double>(), v[1].item<double>());
}

// The batches' tokens, to compare batches by content.
std::vector<std::vector<int64_t>> tokens_of(const std::vector<models::data::Batch>& batches) {
  std::vector<std::vector<int64_t>> out;
  for (const models::data::Batch& b : batches) out.push_back(b.tokens.to_vector<int64_t>());
  return out;
}

TEST(StepPrefetch, AStopSignalSeenByOneRankIsAgreedByEveryRankAfterTheSameStep) {
  std::mutex mu;
  std::vector<std::vector<int>> agreed(2);
  dist::launch(2, [&](dist::RankContext& ctx) {
    const RankGroups g = groups_of(ctx);
    models::data::DataLoader loader(batch_options(), g.dp_rank, 2), reference(batch_options(), g.dp_rank, 2);
    StepPrefetch p(rank_signal);
    t_signal = 0;
    std::vector<int> mine;
    EXPECT_FALSE(p.take_agreed_stop_signal()) << "no step completed yet";
    for (int step = 0; step < 4; ++step) {
      if (ctx.rank == 1 && step == 2) t_signal = SIGTERM;  // only rank 1 sees it, before step 3's read-ahead
      const StepPrefetch::Taken taken = p.take(loader, 1);
      EXPECT_EQ(tokens_of(taken.micro_batches), tokens_of({reference.next()})) << "step " << step << "'s batch";
      read_ahead_and_complete(p, loader, 1, g);
      const std::optional<int> signal = p.take_agreed_stop_signal();
      mine.push_back(signal.value_or(-1));
      EXPECT_FALSE(p.take_agreed_stop_signal()) << "taken once";
    }
    std::lock_guard lock(mu);
    agreed[ctx.rank] = mine;
  });
  const std::vector<int> expected = {0, 0, SIGTERM, SIGTERM};
  EXPECT_EQ(agreed[0], expected);
  EXPECT_EQ(agreed[1], expected);
}

TEST(StepPrefetch, TheReadAheadIsTakenOnlyWhileTheCursorStandsWhereItBegan) {
  dist::launch(2, [&](dist::RankContext& ctx) {
    const RankGroups g = groups_of(ctx);
    models::data::DataLoader loader(batch_options(), g.dp_rank, 2), reference(batch_options(), g.dp_rank, 2);
    StepPrefetch p(no_signal);
    const models::data::DataCursor start = loader.cursor();
    // Read ahead: the cursor is put back; the count is every rank's labels.
    read_ahead_and_complete(p, loader, 2, g);
    EXPECT_TRUE(loader.cursor() == start);
    const std::vector<models::data::Batch> first = {reference.next(), reference.next()};
    const int64_t local = first[0].num_valid_labels + first[1].num_valid_labels;
    const int64_t world =
        ctx.world->all_reduce(scalar_tensor(static_cast<double>(local), {.dtype = DType::f64})).item<int64_t>();
    StepPrefetch::Taken taken = p.take(loader, 2);
    ASSERT_TRUE(taken.valid_labels.has_value());
    EXPECT_EQ(*taken.valid_labels, world);
    EXPECT_EQ(tokens_of(taken.micro_batches), tokens_of(first));
    EXPECT_TRUE(loader.cursor() == reference.cursor()) << "taken batches are consumed";

    // A cursor set in between (a resume to an earlier checkpoint): read again from there, counted by the step.
    read_ahead_and_complete(p, loader, 2, g);
    loader.set_cursor(start);
    taken = p.take(loader, 2);
    EXPECT_FALSE(taken.valid_labels.has_value());
    EXPECT_EQ(tokens_of(taken.micro_batches), tokens_of(first));
    const std::vector<models::data::Batch> second = {reference.next(), reference.next()};
    // A read-ahead whose step never completed (it threw), or another micro-batch count: read again.
    (void)p.read_ahead(loader, 2, g, Device::cpu());
    taken = p.take(loader, 2);
    EXPECT_FALSE(taken.valid_labels.has_value());
    EXPECT_EQ(tokens_of(taken.micro_batches), tokens_of(second));
    read_ahead_and_complete(p, loader, 2, g);
    taken = p.take(loader, 1);
    EXPECT_FALSE(taken.valid_labels.has_value());
    EXPECT_EQ(tokens_of(taken.micro_batches), tokens_of({reference.next()}));
    EXPECT_TRUE(loader.cursor() == reference.cursor());
  });
}

TEST(StepPrefetch, RejectsCallsOutOfOrderWithTheirMessages) {
  EXPECT_CPF_ERROR((void)StepPrefetch(nullptr), "no stop-signal source (pass pending_stop_signal)");
  StepPrefetch p(no_signal);
  models::data::DataLoader loader(batch_options());
  EXPECT_CPF_ERROR(p.complete(1, 0), "StepPrefetch::complete: no read-ahead is pending (call read_ahead first)");
  EXPECT_CPF_ERROR(p.take(loader, 0), "StepPrefetch::take: accum_steps=0 must be at least 1");
  EXPECT_CPF_ERROR(p.read_ahead(loader, 1, RankGroups{}, Device::cpu()),
                   "StepPrefetch::read_ahead: a world of one rank has nothing to agree on");
  dist::launch(2, [&](dist::RankContext& ctx) {
    models::data::DataLoader rank_loader(batch_options(), ctx.rank, 2);
    StepPrefetch q(no_signal);
    EXPECT_CPF_ERROR(q.read_ahead(rank_loader, 0, groups_of(ctx), Device::cpu()),
                     "StepPrefetch::read_ahead: accum_steps=0 must be at least 1");
  });
  Generator gen(11);
  const models::GPT model(models::GPTOptions{.vocab_size = 14, .hidden_size = 16, .num_layers = 1, .num_heads = 2},
                          &gen);
  EXPECT_CPF_ERROR(accumulate_gradients(model, {loader.next()}, RankGroups{}, nullptr, true, -3),
                   "accumulate_gradients: world_valid_labels=-3 is negative");
}

}  // namespace
}  // namespace cpf::trainer
