// The memory planner through the trainer's config (apps/trainer/memory_plan.h): check-config --memory
// prints every part, the device and the longest context per recompute mode for each long-context config;
// a config over the device is refused with the numbers and the knobs, one just over it is warned about;
// a device out of memory during a step gets the planner's estimate added; a bad device name is refused.
#include "apps/trainer/memory_plan.h"

#include <gtest/gtest.h>

#include "support/test_utils.h"
#include "tests/apps/cli_support.h"

namespace cpf::trainer {
namespace {

using testing::repo_root;
using testing::run;

TEST(MemoryPlan, CheckConfigPrintsThePlan) {
  for (const char* config : {"llama3_1b_long.yaml", "llama3_3b_long.yaml", "llama3_8b_long.yaml"}) {
    const auto r = run({"check-config", (repo_root() / "configs" / config).string(), "--device-memory", "h100"});
    ASSERT_EQ(r.code, kExitOk) << r.err;
    for (const char* part :
         {"master weights", "compute copies", "gradients", "optimizer moments", "activations", "attention (CP)",
          "communication", "loss", "total", "device: 79.20 GiB (h100)", "longest context that fits: "}) {
      EXPECT_NE(r.out.find(part), std::string::npos) << config << ": " << part << "\n" << r.out;
    }
  }
  const auto fits = run({"check-config", (repo_root() / "configs" / "llama3_1b_long.yaml").string(), "--memory"});
  EXPECT_NE(fits.out.find("1.24G parameters, 131072 tokens a micro-batch, recompute full"), std::string::npos)
      << fits.out;
  EXPECT_NE(fits.out.find(": fits"), std::string::npos) << fits.out;
  // The 8B at 128k over cp 4 fits an H100 only with its state sharded (parallel.shard: parameters).
  const std::string eight_b = (repo_root() / "configs" / "llama3_8b_long.yaml").string();
  const auto big = run({"check-config", eight_b, "--memory", "--device-memory", "h100"});
  EXPECT_NE(big.out.find(": fits"), std::string::npos) << big.out;
  const auto replicated =
      run({"check-config", eight_b, "--memory", "--device-memory", "h100", "--set", "parallel.shard=gradients"});
  EXPECT_NE(replicated.out.find("does NOT fit"), std::string::npos) << replicated.out;
  const auto bad =
      run({"check-config", (repo_root() / "configs" / "llama3_1b_long.yaml").string(), "--device-memory", "a100"});
  EXPECT_NE(bad.code, kExitOk);
  EXPECT_NE(bad.err.find("unknown device 'a100': name h100 or h200"), std::string::npos) << bad.err;
}

TEST(MemoryPlan, RefusesWhatCannotFitAndWarnsNearTheLimit) {
  const TrainConfig c = load_train_config((repo_root() / "configs" / "llama3_1b_long.yaml").string());
  const double total = models::estimate_memory(memory_plan_input(c)).total();
  EXPECT_FALSE(check_memory_plan(c, total * 1.01).has_value());
  const std::optional<std::string> warning = check_memory_plan(c, total / 1.05);
  ASSERT_TRUE(warning.has_value());
  EXPECT_NE(warning->find("warning: the memory model estimates"), std::string::npos) << *warning;
  EXPECT_CPF_ERROR(
      check_memory_plan(c, total / 2),
      "To fit: model.recompute: full (now full), parallel.shard: parameters over more ranks (now none over "
      "1), a larger parallel.cp (now 1), or a shorter data.seq_len (now 131072)");
}

TEST(MemoryPlan, AnOutOfMemoryGetsTheEstimate) {
  const TrainConfig c = load_train_config((repo_root() / "configs" / "llama3_1b_long.yaml").string());
  const Error oom("allocator.cpp", 1, "", "cuda:0 out of memory in step > forward/attention: tried to allocate 2 GiB");
  const std::optional<std::string> note = out_of_memory_note(oom, c);
  ASSERT_TRUE(note.has_value());
  EXPECT_NE(note->find("the memory planner estimated "), std::string::npos) << *note;
  EXPECT_NE(note->find("recompute full"), std::string::npos) << *note;
  EXPECT_FALSE(out_of_memory_note(Error("x.cpp", 1, "", "a bad token id"), c).has_value());
}

}  // namespace
}  // namespace cpf::trainer
