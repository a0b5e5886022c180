// save_sharded_training_checkpoint (apps/run/checkpointing.h) on CPU thread ranks: every rank writes
// its pieces and rank 0 publishes; a rank whose pieces cannot be written (a NaN) fails every rank, that
// rank with its reason and the others naming the phase, nothing is published and no rank is left waiting.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "apps/run/checkpointing.h"
#include "framework/distributed/launcher.h"
#include "framework/io/checkpoint.h"
#include "framework/optim/sgd.h"
#include "tests/apps/cli_support.h"

namespace cpf::trainer {
namespace {

using testing::addition_yaml;
using testing::scratch_dir;

// Each rank's errors (empty: it returned) from saving step 4 with rank `bad` (-1: none) holding a NaN.
std::vector<std::string> save_on_two_ranks(const TrainConfig& config, int bad) {
  std::vector<std::string> errors(2);
  dist::launch(2,
               [&](dist::RankContext& ctx) {
                 Tensor piece = full({3}, 0.5 + ctx.rank, {.dtype = DType::f32});
                 if (ctx.rank == bad) piece = full({3}, std::nan(""), {.dtype = DType::f32});
                 piece.set_requires_grad(true);
                 const std::string name =
                     "w[" + std::to_string(3 * ctx.rank) + ":" + std::to_string(3 * ctx.rank + 3) + "]";
                 const optim::NamedTensors pieces{{name, piece}};
                 optim::SGD sgd(pieces, {.lr = 0.1});
                 try {
                   save_sharded_training_checkpoint(config, *ctx.world, pieces, sgd, 4, models::data::DataCursor{}, {},
                                                    ctx.device);
                 } catch (const Error& e) {
                   errors[static_cast<size_t>(ctx.rank)] = e.message();
                 }
               },
               {.timeout = std::chrono::seconds(20), .devices = dist::DevicePolicy::cpu});
  return errors;
}

TEST(ShardedTrainingCheckpoint, OneRanksFailureFailsEveryRankAndPublishesNothing) {
  const TrainConfig config =
      load_train_config_string(addition_yaml(scratch_dir("sharded_collective"), 4), "x.yaml", {});
  const std::vector<std::string> errors = save_on_two_ranks(config, 1);
  EXPECT_NE(errors[1].find("write_checkpoint_shard: refusing to write rank 1's pieces"), std::string::npos)
      << errors[1];
  EXPECT_EQ(errors[0],
            "checkpoint at step 4: writing a rank's shard failed on another rank (its log names why); "
            "nothing was published");
  EXPECT_TRUE(io::list_checkpoints(checkpoints_dir(config)).empty());

  const std::vector<std::string> fine = save_on_two_ranks(config, -1);
  EXPECT_EQ(fine, std::vector<std::string>(2));
  const std::vector<std::string> saved = io::list_checkpoints(checkpoints_dir(config));
  ASSERT_EQ(saved.size(), 1u);
  EXPECT_EQ(io::read_checkpoint_meta(saved[0]).step, 4);
  EXPECT_TRUE(std::filesystem::exists(saved[0] + "/model.shard-00001-of-00002.safetensors"));
}

}  // namespace
}  // namespace cpf::trainer
