// When the trainer does not capture its steps in a CUDA graph (apps/trainer/step/step_graph.h), the reason it
// logs names the config key and value: run.cuda_graph off, several ranks, profiling, a device without
// graphs. The graph's behaviour on a GPU is tests/tensor/cuda/step_graph_test.cpp.
#include <gtest/gtest.h>

#include "apps/config/config.h"
#include "apps/trainer/step/step_graph.h"

namespace cpf::trainer {
namespace {

TrainConfig config_with(const std::vector<std::string>& overrides) {
  return load_train_config_string("run:\n  steps: 10\n", "reasons.yaml", overrides);
}

std::string reason(const std::vector<std::string>& overrides, Device device = Device::cuda(0)) {
  return StepGraph::unsupported_reason(config_with(overrides), device).value_or("<none>");
}

TEST(StepGraphReasons, EachNamesItsKeyAndValue) {
  EXPECT_EQ(reason({"run.cuda_graph=false"}), "run.cuda_graph=false");
  EXPECT_EQ(reason({"parallel.dp=2"}),
            "parallel.dp=2 x parallel.cp=1 ranks: steps of several ranks run eagerly (their collectives and label "
            "counts are not captured)");
  EXPECT_EQ(reason({"run.profile=3"}), "run.profile=3: the profiler times every op with events of its own");
}

TEST(StepGraphReasons, TheSwitchComesFirstThenTheConfigThenTheDevice) {
  EXPECT_EQ(reason({"run.cuda_graph=false", "parallel.dp=2"}), "run.cuda_graph=false");
  EXPECT_EQ(reason({"parallel.dp=2", "run.profile=3"}).rfind("parallel.dp=2", 0), 0u);
  EXPECT_EQ(reason({}, Device::cpu()), "the device is cpu (CUDA graphs need a GPU)");
}

TEST(StepGraphReasons, TheSwitchIsOnByDefault) { EXPECT_TRUE(config_with({}).run.cuda_graph); }

}  // namespace
}  // namespace cpf::trainer
