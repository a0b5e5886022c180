// model.recompute on a GPU, through the trainer: bf16 runs with every block recomputed (`full`), with the
// GEMM and attention outputs kept (`selective`) and with the first block only, each with the one-GPU CUDA
// graph (on by default) and with gradient accumulation, train to the same losses, weights and optimizer
// state as the run without recomputation, bit for bit (cuDNN's attention and cuBLASLt's GEMMs are
// deterministic for a fixed shape). Then the memory planner against measured peaks (memory_plan.h): a
// Llama-shaped model at 4k-16k tokens in each recompute mode stays within 10% of the estimate, and the
// recomputed runs need less memory. Skips without a GPU.
#include <gtest/gtest.h>
#include <cmath>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "apps/config/config.h"
#include "apps/trainer/trainer.h"
#include "framework/io/safetensors.h"
#include "support/scratch_dir.h"
#include "tests/tensor/cuda/cuda_test_utils.h"

namespace cpf::trainer {
namespace {

using cpf::testing::CudaTest;

class RecomputeTraining : public CudaTest {};

std::filesystem::path scratch(const std::string& name) { return cpf::testing::scratch_dir(name, "cpformer_gpu_tests"); }

// A 3-layer GQA/SwiGLU model on the copy task, bf16, fixed bshd windows (the CUDA graph replays).
std::string yaml(const std::filesystem::path& out_dir) {
  return "run:\n  out_dir: " + out_dir.string() +
         "\n  steps: 5\n  log_every: 1\n  eval_every: 0\n  eval_batches: 1\n  eval_examples: 0\n  threads: 1\n"
         "  device: cuda\n  precision: bf16\n  resume: never\n"
         "model:\n  hidden_size: 128\n  num_layers: 3\n  num_heads: 4\n  attention: gqa\n  num_kv_heads: 2\n"
         "  mlp: swiglu\n"
         "optimizer:\n  lr: 0.003\n"
         "schedule:\n  warmup_steps: 2\n  total_steps: 40\n"
         "data:\n  source: synthetic\n  task: copy\n  min_len: 2\n  max_len: 12\n"
         "  layout: bshd\n  bshd_fill: window\n  seq_len: 64\n  batch_size: 4\n";
}

struct TrainedRun {
  TrainOutcome outcome;
  std::string log;
};

TrainedRun train_run(const std::string& name, const std::vector<std::string>& overrides) {
  const std::filesystem::path dir = scratch(name);
  const TrainConfig c = load_train_config_string(yaml(dir), "recompute_test.yaml", overrides);
  std::ostringstream out;
  TrainedRun run{train(c, out), ""};
  run.log = out.str();
  return run;
}

void expect_same_checkpoint(const std::string& a, const std::string& b) {
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    const io::NamedTensors ta = io::load_safetensors((std::filesystem::path(a) / file).string());
    const io::NamedTensors tb = io::load_safetensors((std::filesystem::path(b) / file).string());
    ASSERT_EQ(ta.size(), tb.size()) << file;
    for (size_t i = 0; i < ta.size(); ++i) {
      EXPECT_EQ(ta[i].second.to_vector<double>(), tb[i].second.to_vector<double>()) << file << " " << ta[i].first;
    }
  }
}

void expect_recompute_equals_plain(const std::vector<std::string>& common) {
  const TrainedRun plain = train_run("plain", common);
  for (const std::vector<std::string>& mode :
       std::vector<std::vector<std::string>>{{"model.recompute=full"},
                                             {"model.recompute=selective"},
                                             {"model.recompute=full", "model.recompute_layers=1"}}) {
    std::vector<std::string> overrides = common;
    overrides.insert(overrides.end(), mode.begin(), mode.end());
    const TrainedRun run = train_run("recomputed", overrides);
    EXPECT_NE(run.log.find("cuda graph: step 2's forward and backward captured"), std::string::npos) << run.log;
    EXPECT_EQ(run.outcome.losses, plain.outcome.losses) << mode[0];
    expect_same_checkpoint(run.outcome.checkpoint, plain.outcome.checkpoint);
  }
}

TEST_F(RecomputeTraining, Bf16WithTheCudaGraphEqualsNoRecomputationBitForBit) { expect_recompute_equals_plain({}); }

TEST_F(RecomputeTraining, GradientAccumulationEqualsNoRecomputationBitForBit) {
  expect_recompute_equals_plain({"run.grad_accum_steps=2"});
}

TEST_F(RecomputeTraining, MlaEqualsNoRecomputationBitForBit) {
  expect_recompute_equals_plain({"model.attention=mla", "model.num_kv_heads=0", "model.kv_lora_rank=32",
                                 "model.qk_nope_head_dim=16", "model.qk_rope_head_dim=16", "model.v_head_dim=32"});
}

// The last step line's "peak_memory_bytes" and "memory_model_bytes" of metrics.jsonl.
std::pair<double, double> peak_and_model(const std::string& run_dir) {
  std::ifstream in(std::filesystem::path(run_dir) / "metrics.jsonl");
  std::string line, last;
  while (std::getline(in, line)) {
    if (line.find("\"peak_memory_bytes\"") != std::string::npos) last = line;
  }
  auto field = [&](const std::string& key) {
    const size_t at = last.find("\"" + key + "\":");
    return at == std::string::npos ? 0.0 : std::stod(last.substr(at + key.size() + 3));
  };
  return {field("peak_memory_bytes"), field("memory_model_bytes")};
}

// A Llama-3.2-1B-like block (hidden 2048, 32/8 heads, SwiGLU 8192) in 4 layers, vocab 50304, batch 1.
const std::vector<std::string> kLlamaBlocks = {"model.hidden_size=2048",
                                               "model.num_layers=4",
                                               "model.num_heads=32",
                                               "model.num_kv_heads=8",
                                               "model.intermediate_size=8192",
                                               "model.vocab_size=50304",
                                               "model.rope_base=500000",
                                               "data.batch_size=1",
                                               "run.steps=3",
                                               "run.log_every=3",
                                               "data.min_len=200",
                                               "data.max_len=500"};

TEST_F(RecomputeTraining, TheMemoryModelIsWithinTenPercentOfTheMeasuredPeak) {
  const std::vector<std::string>& llama = kLlamaBlocks;
  double peak_none = 0;
  for (const char* mode : {"none", "selective", "full"}) {
    for (int seq : {8192, 16384}) {
      std::vector<std::string> o = llama;
      o.push_back(std::string("model.recompute=") + mode);
      o.push_back("data.seq_len=" + std::to_string(seq));
      const TrainedRun run = train_run(std::string("memory_") + mode, o);
      const auto [peak, model] = peak_and_model(run.outcome.run_dir);
      ASSERT_GT(peak, 0) << run.log;
      ASSERT_GT(model, 0) << run.log;
      std::cout << "memory model: recompute " << mode << " seq " << seq << ": measured " << peak / (1 << 30)
                << " GiB, model " << model / (1 << 30) << " GiB, ratio " << model / peak << "\n";
      EXPECT_NEAR(model / peak, 1.0, 0.10) << mode << " seq " << seq;
      if (seq == 16384 && std::string(mode) == "none") peak_none = peak;
      if (seq == 16384 && std::string(mode) != "none") EXPECT_LT(peak, peak_none) << mode;
    }
  }
}

// run.precision fp8: the linears keep one-byte FP8 copies of their inputs and weights (the memory model
// counts them: models/memory_model.h), with and without recomputation.
TEST_F(RecomputeTraining, TheMemoryModelIsWithinTenPercentOfTheMeasuredFp8Peak) {
  for (const char* mode : {"none", "full"}) {
    std::vector<std::string> o = kLlamaBlocks;
    o.push_back(std::string("model.recompute=") + mode);
    o.push_back("data.seq_len=8192");
    o.push_back("run.precision=fp8");
    const TrainedRun run = train_run(std::string("memory_fp8_") + mode, o);
    const auto [peak, model] = peak_and_model(run.outcome.run_dir);
    ASSERT_GT(peak, 0) << run.log;
    ASSERT_GT(model, 0) << run.log;
    std::cout << "memory model: fp8, recompute " << mode << " seq 8192: measured " << peak / (1 << 30) << " GiB, model "
              << model / (1 << 30) << " GiB, ratio " << model / peak << "\n";
    EXPECT_NEAR(model / peak, 1.0, 0.10) << mode;
  }
}

// fp8.bf16_first_blocks / _last_blocks: the memory model counts those blocks as bf16 (within 10% of the peak);
// fp8.fast_forward_accumulation: cuBLASLt takes it on every forward GEMM of the step; the first loss (same
// weights, only the accumulation differs) stays within 1% of the promoted accumulation's, and every loss is finite.
// Later losses are not compared: on an H100 (2026-12-07) the third step's differed by 4% (10.54 against
// 10.96), as early steps at this learning rate amplify any difference (bf16 and FP8 runs differ as much).
TEST_F(RecomputeTraining, Fp8BlocksKeptInBf16AndFastAccumulationTrain) {
  std::vector<std::string> o = kLlamaBlocks;
  o.insert(o.end(), {"model.recompute=none", "data.seq_len=8192", "run.precision=fp8", "run.steps=3"});
  std::vector<std::string> edges = o;
  edges.insert(edges.end(), {"fp8.bf16_first_blocks=1", "fp8.bf16_last_blocks=1"});
  const TrainedRun run = train_run("memory_fp8_edges", edges);
  const auto [peak, model] = peak_and_model(run.outcome.run_dir);
  ASSERT_GT(peak, 0) << run.log;
  std::cout << "memory model: fp8 with bf16 first and last blocks, seq 8192: measured " << peak / (1 << 30)
            << " GiB, model " << model / (1 << 30) << " GiB, ratio " << model / peak << "\n";
  EXPECT_NEAR(model / peak, 1.0, 0.10);
  const TrainedRun promoted = train_run("fp8_promoted", o);
  std::vector<std::string> fast = o;
  fast.push_back("fp8.fast_forward_accumulation=true");
  const TrainedRun fast_run = train_run("fp8_fast", fast);
  ASSERT_EQ(fast_run.outcome.losses.size(), promoted.outcome.losses.size()) << fast_run.log;
  ASSERT_EQ(fast_run.outcome.losses.size(), 3u) << fast_run.log;
  EXPECT_NEAR(fast_run.outcome.losses[0], promoted.outcome.losses[0], 0.01 * promoted.outcome.losses[0]);
  for (double loss : fast_run.outcome.losses) EXPECT_TRUE(std::isfinite(loss)) << fast_run.log;
}

}  // namespace
}  // namespace cpf::trainer
