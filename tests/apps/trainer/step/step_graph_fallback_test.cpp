// The StepGraph's ways back to eager steps (apps/trainer/step/step_graph.h), shown on the CPU, where no graph can
// be captured: step 1 runs eagerly, step 2's capture fails and that step runs eagerly with the reason
// logged, and the gradients equal plain accumulate_gradients calls. A parameter that still holds a gradient
// when the capture would start ends the graph before it: every replay would add to that gradient in place
// (a failed capture used to drop it instead). The captured path itself is tests/tensor/cuda/step_graph_test.cpp.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "apps/trainer/step/grad_accumulation.h"
#include "apps/trainer/step/step_graph.h"
#include "models/data/data_loader.h"
#include "tests/apps/addition_batches.h"
#include "tests/support/test_utils.h"

namespace cpf::trainer {
namespace {

using Grads = std::map<std::string, std::vector<double>>;

struct TrainedSteps {
  std::vector<Grads> grads;  // after each step
  std::vector<std::string> notes;
};

models::data::DataOptions batch_options() { return cpf::testing::addition_batches(); }

// Three steps of two micro-batches each on a tiny f64 GPT; the gradients are dropped after each step
// (as Optimizer::zero_grad does) when `zero_grad`, else they accumulate over the steps.
TrainedSteps train(bool with_graph, bool zero_grad) {
  Generator gen(11);
  const models::GPT model(
      models::GPTOptions{.vocab_size = 14, .hidden_size = 16, .num_layers = 2, .num_heads = 2, .dtype = DType::f64},
      &gen);
  const optim::NamedTensors params = model.named_parameters();
  models::data::DataLoader loader(batch_options());
  const RankGroups groups;  // one rank
  TrainedSteps run;
  StepGraph graph([&run](const std::string& line) { run.notes.push_back(line); });
  for (int64_t step = 0; step < 3; ++step) {
    const std::vector<models::data::Batch> batches = {loader.next(), loader.next()};
    if (with_graph) {
      (void)graph.accumulate(model, batches, groups, params, step);
    } else {
      (void)accumulate_gradients(model, batches, groups, nullptr);
    }
    Grads grads;
    for (const auto& [name, p] : params) grads[name] = p.grad().to_vector<double>();
    run.grads.push_back(grads);
    if (zero_grad) {
      for (const auto& [name, p] : params) p.set_grad(Tensor());
    }
  }
  EXPECT_FALSE(graph.captured());
  return run;
}

void expect_same_grads(const TrainedSteps& a, const TrainedSteps& b) {
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t s = 0; s < a.grads.size(); ++s) {
    EXPECT_EQ(a.grads[s], b.grads[s]) << "step " << s + 1;
    EXPECT_FALSE(a.grads[s].empty());
  }
}

TEST(StepGraphFallback, AFailedCaptureRunsTheStepEagerlyWithItsReason) {
  const TrainedSteps graph = train(true, true), eager = train(false, true);
  expect_same_grads(graph, eager);
  ASSERT_EQ(graph.notes.size(), 1u);
  EXPECT_EQ(graph.notes[0].rfind("cuda graph: off from step 2: DeviceGraph::capture: cpu cannot capture graphs", 0), 0u)
      << graph.notes[0];
}

TEST(StepGraphFallback, AGradientHeldBeforeTheCaptureEndsTheGraphAndIsKept) {
  const TrainedSteps graph = train(true, false), eager = train(false, false);
  expect_same_grads(graph, eager);  // step 2 adds to step 1's gradients, as eager accumulation does
  ASSERT_EQ(graph.notes.size(), 1u);
  EXPECT_EQ(graph.notes[0].rfind("cuda graph: off from step 2: parameter ", 0), 0u) << graph.notes[0];
  EXPECT_NE(graph.notes[0].find(" holds a gradient before the capture (every replay would add to it; "
                                "Optimizer::zero_grad drops it)"),
            std::string::npos)
      << graph.notes[0];
}

}  // namespace
}  // namespace cpf::trainer
