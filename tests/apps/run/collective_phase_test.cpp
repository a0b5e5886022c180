// run_collective_phase (apps/run/collective_phase.h) on CPU thread ranks: a phase that fails on one rank
// fails every rank, that rank with its own message and the others with the phase's "failed on another
// rank" message (the sharded save's and the sharded resume's, rank_trainer.cpp), and no rank is left
// waiting; a phase that fails nowhere returns everywhere, and one that fails everywhere gives each rank
// its own reason. The resume message is the one a rank reads when another rank's checkpoint pieces could
// not be read (which the resume's checkpoint selection otherwise prevents, so no run reaches it here).
#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#include "apps/run/collective_phase.h"
#include "framework/core/error.h"
#include "framework/distributed/launcher.h"

namespace cpf::trainer {
namespace {

const std::string kElsewhere =
    "resume: loading runs/x/checkpoints/step_00000008 failed on another rank (its log names why)";

// Each rank's message (empty: it returned) when the phase throws on the ranks in `failing`.
std::vector<std::string> run_on(int ranks, const std::vector<int>& failing, bool only_rank0_runs = false) {
  std::vector<std::string> errors(static_cast<size_t>(ranks));
  dist::launch(ranks,
               [&](dist::RankContext& ctx) {
                 const bool mine = !only_rank0_runs || ctx.rank == 0;
                 try {
                   run_collective_phase(
                       *ctx.world, ctx.device, mine,
                       [&] {
                         for (int f : failing) {
                           if (ctx.rank == f) {
                             throw std::runtime_error("rank " + std::to_string(f) + ": shard 3 checksum mismatch");
                           }
                         }
                       },
                       kElsewhere);
                 } catch (const Error& e) {
                   errors[static_cast<size_t>(ctx.rank)] = e.message();
                 }
               },
               {.timeout = std::chrono::seconds(20), .devices = dist::DevicePolicy::cpu});
  return errors;
}

TEST(CollectivePhase, OneRanksFailureFailsEveryRankNamingItsOwnReasonThere) {
  const std::vector<std::string> errors = run_on(3, {1});
  EXPECT_EQ(errors[1], "rank 1: shard 3 checksum mismatch");
  EXPECT_EQ(errors[0], kElsewhere);
  EXPECT_EQ(errors[2], kElsewhere);
}

TEST(CollectivePhase, NoFailureReturnsEverywhereAndEveryFailureKeepsItsReason) {
  EXPECT_EQ(run_on(2, {}), std::vector<std::string>(2));
  const std::vector<std::string> both = run_on(2, {0, 1});
  EXPECT_EQ(both[0], "rank 0: shard 3 checksum mismatch");
  EXPECT_EQ(both[1], "rank 1: shard 3 checksum mismatch");
}

TEST(CollectivePhase, ARankThatDoesNotRunThePhaseLearnsOfTheFailure) {
  const std::vector<std::string> errors = run_on(2, {0}, true);  // rank 0 publishes, rank 1 waits
  EXPECT_EQ(errors[0], "rank 0: shard 3 checksum mismatch");
  EXPECT_EQ(errors[1], kElsewhere);
}

}  // namespace
}  // namespace cpf::trainer
