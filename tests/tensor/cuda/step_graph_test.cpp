// CUDA-graph capture of the training step (apps/trainer/step/step_graph.h) on a GPU: a run whose batches keep
// their layout captures step 2 and replays it, and its losses and final weights and optimizer state equal
// the eager run's bit for bit, in fp32 and bf16 and with gradient accumulation; packed documents, whose
// layout changes every batch, end the graph at step 3 with the reason logged and still train exactly as
// eager. Skips without a GPU.
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include "apps/config/config.h"
#include "apps/trainer/trainer.h"
#include "framework/io/safetensors.h"
#include "support/scratch_dir.h"
#include "tests/tensor/cuda/cuda_test_utils.h"

namespace cpf::trainer {
namespace {

using cpf::testing::CudaTest;

class StepGraphTraining : public CudaTest {};

std::filesystem::path scratch(const std::string& name) { return cpf::testing::scratch_dir(name, "cpformer_gpu_tests"); }

// A 2-layer model on the copy task, evaluated (held-out loss, eager) after step 3 and at the end. bshd windows keep
// every batch's layout (8 rows of 32 tokens; the valid labels vary with the prompts); thd packs documents of varying
// lengths, so the layout changes from batch to batch.
std::string yaml(const std::filesystem::path& out_dir, bool fixed_layout) {
  std::string data = fixed_layout ? "  layout: bshd\n  bshd_fill: window\n  seq_len: 32\n  batch_size: 8\n"
                                  : "  layout: thd\n  seq_len: 32\n  tokens_per_batch: 256\n  pad_multiple: 8\n";
  return "run:\n  out_dir: " + out_dir.string() +
         "\n  steps: 6\n  log_every: 1\n  eval_every: 3\n  eval_batches: 2\n  eval_examples: 0\n  threads: 1\n"
         "  device: cuda\n  resume: never\n"
         "model:\n  hidden_size: 64\n  num_layers: 2\n  num_heads: 4\n"
         "optimizer:\n  lr: 0.003\n"
         "schedule:\n  warmup_steps: 2\n  total_steps: 40\n"
         "data:\n  source: synthetic\n  task: copy\n  min_len: 2\n  max_len: 12\n" +
         data;
}

struct TrainedRun {
  TrainOutcome outcome;
  std::string log;
};

TrainedRun train_run(const std::filesystem::path& dir, bool fixed_layout, const std::vector<std::string>& overrides) {
  const TrainConfig c = load_train_config_string(yaml(dir, fixed_layout), "step_graph_test.yaml", overrides);
  std::ostringstream out;
  TrainedRun run{train(c, out), ""};
  run.log = out.str();
  return run;
}

// Every tensor of the two checkpoints' files, compared exactly.
void expect_same_checkpoint(const std::string& a, const std::string& b) {
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    const auto pa = std::filesystem::path(a) / file, pb = std::filesystem::path(b) / file;
    if (!std::filesystem::exists(pa)) continue;
    const io::NamedTensors ta = io::load_safetensors(pa.string()), tb = io::load_safetensors(pb.string());
    ASSERT_EQ(ta.size(), tb.size()) << file;
    for (size_t i = 0; i < ta.size(); ++i) {
      EXPECT_EQ(ta[i].first, tb[i].first);
      EXPECT_EQ(ta[i].second.to_vector<double>(), tb[i].second.to_vector<double>()) << file << " " << ta[i].first;
    }
  }
}

// graph_ends: the graph is expected to end (with the reason in expect_note) even with a fixed layout.
void expect_graph_equals_eager(bool fixed_layout, const std::vector<std::string>& overrides, const char* expect_note,
                               bool graph_ends = false) {
  std::vector<std::string> with_graph = overrides, without = overrides;
  without.push_back("run.cuda_graph=false");
  const TrainedRun graph = train_run(scratch("graph"), fixed_layout, with_graph);
  const TrainedRun eager = train_run(scratch("eager"), fixed_layout, without);
  EXPECT_NE(graph.log.find(expect_note), std::string::npos) << graph.log;
  // A fixed layout replays every later step: the copy task's ignored prompt labels change the loss's
  // divisor from batch to batch, which the graph reads from device memory.
  if (fixed_layout && !graph_ends) EXPECT_EQ(graph.log.find("cuda graph: off"), std::string::npos) << graph.log;
  EXPECT_EQ(eager.log.find("cuda graph"), std::string::npos) << eager.log;
  ASSERT_EQ(graph.outcome.losses.size(), 6u);
  EXPECT_EQ(graph.outcome.losses, eager.outcome.losses);
  // The held-out loss after step 3 (between replays) and at the end reads the bf16 weight copies an eager
  // forward refreshes: equal only when the replays' updates reached them.
  ASSERT_TRUE(graph.outcome.last_eval && eager.outcome.last_eval);
  ASSERT_TRUE(graph.outcome.last_eval->loss && eager.outcome.last_eval->loss);
  EXPECT_EQ(*graph.outcome.last_eval->loss, *eager.outcome.last_eval->loss);
  expect_same_checkpoint(graph.outcome.checkpoint, eager.outcome.checkpoint);
}

TEST_F(StepGraphTraining, FixedLayoutFp32ReplaysAndEqualsEagerBitForBit) {
  expect_graph_equals_eager(true, {}, "cuda graph: step 2's forward and backward captured (1 micro-batch)");
}

TEST_F(StepGraphTraining, FixedLayoutBf16ReplaysAndEqualsEagerBitForBit) {
  expect_graph_equals_eager(true, {"run.precision=bf16"}, "cuda graph: step 2's forward and backward captured");
}

TEST_F(StepGraphTraining, GradientAccumulationReplaysAllMicroBatches) {
  expect_graph_equals_eager(true, {"run.precision=bf16", "run.grad_accum_steps=3"}, "captured (3 micro-batches)");
}

TEST_F(StepGraphTraining, ChangingLayoutsEndTheGraphWithTheReasonAndTrainAsEager) {
  expect_graph_equals_eager(false, {"run.precision=bf16"},
                            "cuda graph: off from step 3: step 3's batch differs from the captured one: ");
}

TEST_F(StepGraphTraining, ProfilingRunsEagerlyAndSaysWhy) {
  const TrainedRun run = train_run(scratch("profile"), true, {"run.profile=2", "run.steps=4"});
  EXPECT_NE(run.log.find("cuda graph: off: run.profile=2: the profiler times every op"), std::string::npos) << run.log;
}

// Review additions. The unfused loss takes the valid-label count as a kernel argument: a batch whose count
// differs ends the graph with that reason, and the run still equals eager.
TEST_F(StepGraphTraining, TheUnfusedLossEndsTheGraphWhenTheLabelCountChanges) {
  expect_graph_equals_eager(true, {"model.classifier_chunk_rows=-1"}, "its valid labels (the loss's divisor) went from",
                            true);
}

// A capture that fails (here the CPF_CUDA_SYNC=1 debug mode, which synchronises after every launch, which a
// capture forbids) ends the graph with its reason, and step 2 runs eagerly from the state before the capture
// (what the failed capture made, gradients and bf16 copies, holds no values and must not be used).
TEST_F(StepGraphTraining, AFailedCaptureEndsTheGraphAndTrainsAsEager) {
  struct SyncDebug {
    bool before = cuda::sync_debug();
    SyncDebug() { cuda::set_sync_debug(true); }
    ~SyncDebug() { cuda::set_sync_debug(before); }
  } on;
  expect_graph_equals_eager(true, {"run.precision=bf16"},
                            "cuda graph: off from step 2: CUDA-graph capture on cuda:0 failed", true);
}

// A resumed session starts eagerly again (new caches and plans), captures its second step (step 5) and
// replays after: its losses and final checkpoint equal those of the same split run eagerly.
TEST_F(StepGraphTraining, AResumedSessionCapturesAfresh) {
  const auto two_sessions = [](const std::string& name, const std::string& graph) {
    const std::filesystem::path dir = scratch(name);
    const TrainedRun first = train_run(dir, true, {"run.precision=bf16", "run.steps=3", graph});
    TrainedRun second = train_run(dir, true, {"run.precision=bf16", "run.resume=auto", graph});
    second.outcome.losses.insert(second.outcome.losses.begin(), first.outcome.losses.begin(),
                                 first.outcome.losses.end());
    return second;
  };
  const TrainedRun graph = two_sessions("graph_resumed", "run.cuda_graph=true");
  const TrainedRun eager = two_sessions("eager_resumed", "run.cuda_graph=false");
  EXPECT_NE(graph.log.find("cuda graph: step 5's forward and backward captured"), std::string::npos) << graph.log;
  ASSERT_EQ(graph.outcome.losses.size(), 6u);
  EXPECT_EQ(graph.outcome.losses, eager.outcome.losses);
  expect_same_checkpoint(graph.outcome.checkpoint, eager.outcome.checkpoint);
}

}  // namespace
}  // namespace cpf::trainer
