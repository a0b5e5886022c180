// Training on the GPU through the trainer (run.device: cuda): the fp32 run reproduces the CPU run's
// losses, bf16 mixed precision tracks fp32, context parallelism over thread ranks sharing the GPU
// matches one rank, resume continues the run, the log shows tokens/s and peak GPU memory, and a GPU
// checkpoint (f32 master weights) generates on the CPU. Skips without a visible GPU.
//
// Every failure prints the step, both losses and their relative difference.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <sstream>

#include "apps/cli/cli.h"
#include "apps/trainer/step/step_window.h"
#include "apps/trainer/step/training_step.h"
#include "apps/trainer/trainer.h"
#include "framework/autograd/grad_mode.h"
#include "framework/io/safetensors.h"
#include "framework/optim/adamw.h"
#include "support/scratch_dir.h"
#include "tests/tensor/cuda/cuda_test_utils.h"

namespace cpf::trainer {
namespace {

using cpf::testing::CudaTest;

std::filesystem::path scratch(const std::string& name) { return cpf::testing::scratch_dir(name, "cpformer_gpu_tests"); }

// 1-2 digit addition, a 2-layer model with head dim 16 (cuDNN runs it in bf16; f32 runs unfused),
// 256-token packed batches padded for cp up to 4.
std::string tiny_yaml(const std::filesystem::path& out_dir, int64_t steps) {
  return "run:\n  out_dir: " + out_dir.string() + "\n  steps: " + std::to_string(steps) +
         "\n  log_every: 1\n  eval_every: 0\n  eval_batches: 1\n  eval_examples: 16\n  threads: 1\n"
         "  resume: auto\n"
         "model:\n  hidden_size: 64\n  num_layers: 2\n  num_heads: 4\n"
         "optimizer:\n  lr: 0.003\n"
         "schedule:\n  warmup_steps: 2\n  total_steps: 40\n"
         "data:\n  min_len: 1\n  max_len: 2\n  seq_len: 16\n  tokens_per_batch: 256\n  pad_multiple: 8\n";
}

TrainOutcome train_with(const std::filesystem::path& dir, int64_t steps, const std::vector<std::string>& overrides,
                        std::string* log = nullptr) {
  const TrainConfig c = load_train_config_string(tiny_yaml(dir, steps), "gpu_test.yaml", overrides);
  std::ostringstream out;
  TrainOutcome outcome = train(c, out);
  if (log) *log = out.str();
  return outcome;
}

// Each step's |actual - expected| <= rtol * |expected|; a failure names the step and both losses.
void expect_tracks(const std::vector<double>& actual, const std::vector<double>& expected, double rtol,
                   const std::string& what, size_t first_step = 0) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = first_step; i < expected.size(); ++i) {
    const double rel = std::abs(actual[i] - expected[i]) / std::abs(expected[i]);
    EXPECT_LE(rel, rtol) << what << ": step " << i + 1 << " loss " << actual[i] << " vs " << expected[i]
                         << " (relative difference " << rel << ", bound " << rtol << ")";
  }
}

class GpuTraining : public CudaTest {};

Tensor on_gpu_full(const Shape& shape, double value) {
  return cpf::testing::on_gpu(full(shape, value, {.dtype = DType::f32}));
}

// fp32 on the GPU against the CPU. The first loss comes from identical weights (drawn on the CPU,
// copied) through f32 kernels that round like the CPU's up to summation order: 1e-5 relative. Later
// steps add AdamW updates, whose normalisation amplifies rounding differences in tiny gradients; over
// 10 steps 1e-3 relative still catches any wrong kernel or missing update (those move the loss by
// 1e-2 or more within a few steps).
TEST_F(GpuTraining, Fp32OnCudaMatchesTheCpuRun) {
  const auto cpu = train_with(scratch("cpu"), 10, {});
  const auto gpu = train_with(scratch("cuda"), 10, {"run.device=cuda"});
  ASSERT_EQ(gpu.losses.size(), 10u);
  expect_tracks({gpu.losses[0]}, {cpu.losses[0]}, 1e-5, "fp32 cuda vs cpu, first step");
  expect_tracks(gpu.losses, cpu.losses, 1e-3, "fp32 cuda vs cpu");
}

// bf16 against fp32, on the GPU and against the CPU's bf16 emulation: the bound of
// tests/apps/trainer/precision_test.cpp (1e-2: 8-bit mantissas, measured ~1e-4 on the CPU), here over 20 steps.
TEST_F(GpuTraining, Bf16OnCudaTracksFp32) {
  const auto fp32 = train_with(scratch("fp32"), 20, {"run.device=cuda"});
  const auto bf16 = train_with(scratch("bf16"), 20, {"run.device=cuda", "run.precision=bf16"});
  expect_tracks(bf16.losses, fp32.losses, 1e-2, "bf16 vs fp32 on cuda");
  const auto cpu_bf16 = train_with(scratch("cpu_bf16"), 20, {"run.precision=bf16"});
  expect_tracks(bf16.losses, cpu_bf16.losses, 1e-2, "bf16 cuda vs bf16 cpu");
  EXPECT_LT(bf16.losses.back(), 0.85 * bf16.losses.front()) << "bf16 on cuda does not learn";
}

// The attention backends through the config: unfused explicitly, and cuDNN (auto) with a
// deterministic backward, whose two runs must agree bit for bit.
TEST_F(GpuTraining, AttentionBackendKeysReachTheKernels) {
  const auto fp32 = train_with(scratch("fp32"), 8, {"run.device=cuda"});
  const auto unfused =
      train_with(scratch("unfused"), 8, {"run.device=cuda", "run.precision=bf16", "attention.backend=unfused"});
  expect_tracks(unfused.losses, fp32.losses, 1e-2, "bf16 unfused vs fp32");
  const std::vector<std::string> det = {"run.device=cuda", "run.precision=bf16", "attention.deterministic=true"};
  const auto a = train_with(scratch("det_a"), 8, det);
  const auto b = train_with(scratch("det_b"), 8, det);
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i) {
    EXPECT_EQ(a.losses[i], b.losses[i]) << "attention.deterministic: true, step " << i + 1 << " differs between runs";
  }
  expect_tracks(a.losses, fp32.losses, 1e-2, "bf16 deterministic vs fp32");
}

// Context parallelism with thread ranks sharing one GPU (every rank on cuda:0 on a 1-GPU machine):
// the same steps as one rank, up to summation order (1e-4: looser than the CPU's 1e-5 because the
// ranks' partial attention results merge through the LSE on the GPU in another order).
TEST_F(GpuTraining, ContextParallelRanksSharingTheGpuMatchOneRank) {
  const auto one = train_with(scratch("cp1"), 6, {"run.device=cuda"});
  for (const char* strategy : {"p2p", "all_gather", "a2a"}) {
    const auto two = train_with(scratch(std::string("cp2_") + strategy), 6,
                                {"run.device=cuda", "parallel.cp=2", std::string("parallel.cp_comm_type=") + strategy});
    expect_tracks(two.losses, one.losses, 1e-4, std::string("cp=2 ") + strategy + " vs one rank on cuda");
  }
  const auto bf16_cp = train_with(scratch("bf16_cp2"), 6, {"run.device=cuda", "run.precision=bf16", "parallel.cp=2"});
  expect_tracks(bf16_cp.losses, one.losses, 1e-2, "bf16 cp=2 vs fp32 one rank on cuda");
}

// Resume on the GPU: weights and optimizer state come back from the checkpoint (written through the
// host) onto the device. 1e-6 relative (the kernels are deterministic, so this is expected to be exact;
// the message says so when it is not).
TEST_F(GpuTraining, ResumeContinuesTheRun) {
  const auto full_dir = scratch("full"), split_dir = scratch("split");
  const auto full = train_with(full_dir, 6, {"run.device=cuda", "run.checkpoint_every=3"});
  const auto first = train_with(split_dir, 3, {"run.device=cuda"});
  const auto second = train_with(split_dir, 6, {"run.device=cuda"});
  EXPECT_EQ(second.start_step, 3);
  ASSERT_EQ(second.losses.size(), 3u);
  ASSERT_EQ(full.losses.size(), 6u);
  const std::vector<double> head(full.losses.begin(), full.losses.begin() + 3);
  const std::vector<double> tail(full.losses.begin() + 3, full.losses.end());
  expect_tracks(first.losses, head, 1e-6, "first half");
  expect_tracks(second.losses, tail, 1e-6, "resumed half");
}

// The CLI on the shipped GPU smoke config: exit 0, step lines with tokens/s and the peak GPU memory,
// evaluation (held-out loss and exact match decoded on the GPU), a checkpoint of f32 master weights
// that `cpformer generate` (CPU) completes.
TEST_F(GpuTraining, GpuTinyConfigLogsMemoryAndItsCheckpointGenerates) {
  const auto dir = scratch("run");
  std::ostringstream out, err;
  // The shipped config's text as it was at build time (tests/CMakeLists.txt embeds it), written next
  // to the run: the GPU machines run this binary without the sources.
  const std::string config = (dir.parent_path() / (dir.filename().string() + ".gpu_tiny.yaml")).string();
  {
    std::ofstream file(config);
    file <<
#include "gpu_tiny_yaml.inc"
        ;
    ASSERT_TRUE(file.good()) << "cannot write " << config;
  }
  const int code = run_cli({"train", config, "--set", "run.out_dir=" + dir.string(), "--set", "run.steps=60", "--set",
                            "run.eval_every=30", "--set", "run.log_every=20"},
                           out, err, false);
  ASSERT_EQ(code, 0) << out.str() << err.str();
  const std::string log = out.str();
  EXPECT_NE(log.find("cuda bf16 (f32 master weights)"), std::string::npos) << log;
  // "... | 1.2M tok/s | MFU 3.1% | 65.5k tok | peak mem 1.2 GiB | ..." (MFU on GPUs of known peak).
  EXPECT_NE(log.find(" tok/s | "), std::string::npos) << log;
  EXPECT_NE(log.find(" tok | peak mem "), std::string::npos) << log;
  // "peak mem 38 MiB (model 5 MiB) | ": the measured peak, then the memory model's estimate.
  EXPECT_TRUE(std::regex_search(log, std::regex(R"(peak mem [0-9.]+ [MG]iB \(model [0-9.]+ [MG]iB\) \| )"))) << log;
  EXPECT_NE(log.find("exact match"), std::string::npos) << log;
  std::ifstream metrics_file(dir / "metrics.jsonl");
  const std::string metrics((std::istreambuf_iterator<char>(metrics_file)), std::istreambuf_iterator<char>());
  EXPECT_NE(metrics.find("\"peak_memory_bytes\""), std::string::npos) << metrics;

  const auto checkpoints = dir / "checkpoints";
  ASSERT_TRUE(std::filesystem::exists(checkpoints)) << log;
  std::filesystem::path latest;
  for (const auto& entry : std::filesystem::directory_iterator(checkpoints)) {
    if (entry.path().filename().string().rfind("step_", 0) == 0 && entry.path() > latest) latest = entry.path();
  }
  ASSERT_FALSE(latest.empty()) << "no checkpoint in " << checkpoints;
  for (const auto& e : io::read_safetensors_header((latest / "model.safetensors").string()).entries) {
    EXPECT_EQ(e.dtype, DType::f32) << "model tensor " << e.name;
  }
  std::ostringstream gen_out, gen_err;
  const int gen_code =
      run_cli({"generate", dir.string(), "--prompt", "12+34=", "--tokens", "3"}, gen_out, gen_err, false);
  EXPECT_EQ(gen_code, 0) << gen_out.str() << gen_err.str();
  EXPECT_NE(gen_out.str().find("12+34="), std::string::npos) << gen_out.str();
}

// The step tests' batches: packed 2-digit additions, 64 storage tokens, slots padded to 8, in a fixed order.
models::data::DataOptions two_digit_batches() {
  models::data::DataOptions d;
  d.source = "synthetic";
  d.min_len = 2;
  d.max_len = 2;
  d.seq_len = 16;
  d.tokens_per_batch = 64;
  d.pad_multiple = 8;
  d.shuffle = false;
  return d;
}

// training_step on the GPU (docs/training.md, "Host synchronisation in a step"): once warm, a step reads
// nothing back with a device->host copy and waits for one event (the norm and the loss, recorded before
// the clip and AdamW kernels); a step with a non-finite norm changes no parameter or AdamW state and
// does not advance the step count.
TEST_F(GpuTraining, TrainingStepWaitsForOneEventAndSkipsANonFiniteNormOnTheDevice) {
  const models::data::DataOptions d = two_digit_batches();
  for (bool poison : {false, true}) {
    Generator gen(5);
    models::GPT model(models::GPTOptions{.vocab_size = 14, .hidden_size = 32, .num_layers = 2, .num_heads = 2}, &gen);
    model.to(Device::cuda(0));
    const optim::NamedTensors params = model.named_parameters();
    if (poison) {
      NoGradGuard no_grad;
      raw::copy_(params.front().second, on_gpu_full(params.front().second.shape(), NAN));
    }
    models::data::DataLoader loader(d);
    RankGroups g;
    optim::AdamW adamw(params, optim::AdamWOptions{.lr = 1e-2});
    const optim::LrSchedule schedule(optim::LrScheduleOptions{.decay = optim::LrDecay::constant, .lr = 1e-2});
    const StepParts parts{.model = model,
                          .loader = loader,
                          .groups = g,
                          .reducer = nullptr,
                          .params = params,
                          .optimizer = adamw,
                          .schedule = schedule,
                          .accum_steps = 1,
                          .grad_clip = 0.01};
    const std::vector<double> last_before = params.back().second.to_vector<double>();
    for (int64_t step = 0; step < 6; ++step) {
      const cuda::HostSyncCounts before = cuda::host_sync_counts();
      const StepResult r = training_step(parts, step);
      const cuda::HostSyncCounts n = cuda::host_sync_counts() - before;
      EXPECT_EQ(r.skipped, poison) << "step " << step;
      EXPECT_EQ(std::isfinite(r.grad_norm), !poison) << "step " << step;
      if (!poison) EXPECT_GT(r.grad_norm, 0.01) << "step " << step << ": the clip kernel had work";
      if (step < 3) continue;  // warming up: the allocator's cache, the attention tables
      EXPECT_EQ(n.device_to_host, 0u) << "step " << step << ": " << cuda::to_string(n);
      EXPECT_EQ(n.stream_syncs, 1u) << "step " << step << ": " << cuda::to_string(n);
      EXPECT_EQ(n.device_syncs, 0u) << "step " << step << ": " << cuda::to_string(n);
    }
    EXPECT_EQ(adamw.step_count(), poison ? 0 : 6);
    EXPECT_EQ(params.back().second.to_vector<double>() == last_before, poison);
    if (poison) {
      for (const auto& [name, state] : adamw.state_tensors()) {
        EXPECT_EQ(state.to_vector<double>(), std::vector<double>(static_cast<size_t>(state.numel()), 0.0)) << name;
      }
    }
  }
}

// The tensor's values with every NaN replaced by a marker, so that poisoned tensors compare equal exactly
// when their NaNs sit at the same places and every other value is equal.
std::vector<double> nan_as_marker(const Tensor& t) {
  std::vector<double> v = t.to_vector<double>();
  for (double& x : v) {
    if (std::isnan(x)) x = -12345.0;
  }
  return v;
}

// One rank reads its steps back in windows (step_window.h): training_step_deferred waits for nothing, the
// window's read is the one host synchronisation (a device-to-host copy), and the steps' losses, norms,
// parameters and AdamW state equal those of training_step, which waits once per step, bit for bit.
TEST_F(GpuTraining, DeferredStepsWaitOnlyAtTheWindowsReadBackAndEqualPerStepReadBacks) {
  const models::data::DataOptions d = two_digit_batches();
  for (bool poison : {false, true}) {
    Generator gen_a(5), gen_b(5);
    const models::GPTOptions options{.vocab_size = 14, .hidden_size = 32, .num_layers = 2, .num_heads = 2};
    models::GPT each_model(options, &gen_a), window_model(options, &gen_b);
    each_model.to(Device::cuda(0));
    window_model.to(Device::cuda(0));
    const optim::NamedTensors each_params = each_model.named_parameters(), params = window_model.named_parameters();
    if (poison) {  // every step's norm is NaN: skipped steps inside windows
      NoGradGuard no_grad;
      raw::copy_(each_params.front().second, on_gpu_full(each_params.front().second.shape(), NAN));
      raw::copy_(params.front().second, on_gpu_full(params.front().second.shape(), NAN));
    }
    models::data::DataLoader each_loader(d), loader(d);
    RankGroups g;
    optim::AdamW each_adamw(each_params, optim::AdamWOptions{.lr = 1e-2}),
        adamw(params, optim::AdamWOptions{.lr = 1e-2});
    const optim::LrSchedule schedule(optim::LrScheduleOptions{.decay = optim::LrDecay::constant, .lr = 1e-2});
    auto parts = [&](const models::GPT& m, models::data::DataLoader& l, const optim::NamedTensors& p, optim::AdamW& o) {
      return StepParts{.model = m,
                       .loader = l,
                       .groups = g,
                       .reducer = nullptr,
                       .params = p,
                       .optimizer = o,
                       .schedule = schedule,
                       .accum_steps = 1,
                       .grad_clip = 0.01};
    };
    std::vector<StepResult> expected;
    for (int64_t step = 0; step < 8; ++step) {
      expected.push_back(training_step(parts(each_model, each_loader, each_params, each_adamw), step));
    }
    StepWindow window(Device::cuda(0));
    std::vector<StepResult> read;
    size_t settled = 0;
    for (int64_t step = 0; step < 8; ++step) {
      const cuda::HostSyncCounts before = cuda::host_sync_counts();
      training_step_deferred(parts(window_model, loader, params, adamw), step, window);
      const cuda::HostSyncCounts n = cuda::host_sync_counts() - before;
      if (step >= 3) EXPECT_EQ(n.total(), 0u) << "step " << step << ": " << cuda::to_string(n);
      if (step != 2 && step != 7) continue;  // windows of 3 and 5 steps
      const cuda::HostSyncCounts at_read = cuda::host_sync_counts();
      for (const StepResult& r : window.read()) read.push_back(r);
      const cuda::HostSyncCounts waited = cuda::host_sync_counts() - at_read;
      if (step == 7) EXPECT_EQ(waited.total(), 1u) << cuda::to_string(waited);  // warm: the copy only
      std::vector<bool> applied;
      for (size_t i = settled; i < read.size(); ++i) applied.push_back(!read[i].skipped);
      adamw.settle(applied);
      settled = read.size();
    }
    ASSERT_EQ(read.size(), expected.size());
    for (size_t i = 0; i < read.size(); ++i) {
      EXPECT_EQ(std::isnan(read[i].loss) ? -1.0 : read[i].loss, std::isnan(expected[i].loss) ? -1.0 : expected[i].loss)
          << "step " << i;
      EXPECT_EQ(std::isnan(read[i].grad_norm) ? -1.0 : read[i].grad_norm,
                std::isnan(expected[i].grad_norm) ? -1.0 : expected[i].grad_norm)
          << "step " << i;
      EXPECT_EQ(read[i].skipped, expected[i].skipped) << "step " << i;
      EXPECT_EQ(read[i].tokens, expected[i].tokens) << "step " << i;
    }
    EXPECT_EQ(adamw.step_count(), each_adamw.step_count());
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_EQ(nan_as_marker(params[i].second), nan_as_marker(each_params[i].second)) << params[i].first;
    }
    const optim::NamedTensors state = adamw.state_tensors(), each_state = each_adamw.state_tensors();
    for (size_t i = 0; i < state.size(); ++i) {
      EXPECT_EQ(nan_as_marker(state[i].second), nan_as_marker(each_state[i].second)) << state[i].first;
    }
  }
}

// Through the trainer on the GPU (step graph on): step lines every 25 steps (windows of up to 25 steps,
// an evaluation and a checkpoint inside) give the losses of the run that reads every step back, bit for bit.
TEST_F(GpuTraining, WindowedRunEqualsTheRunThatReadsEveryStepBack) {
  const std::vector<std::string> common = {"run.device=cuda", "run.eval_every=10", "run.checkpoint_every=15"};
  auto with = [&](const std::string& log_every) {
    auto o = common;
    o.push_back("run.log_every=" + log_every);
    return o;
  };
  const auto each = train_with(scratch("window_each"), 40, with("1"));
  const auto windowed = train_with(scratch("window_25"), 40, with("25"));
  ASSERT_EQ(each.losses.size(), 40u);
  EXPECT_EQ(windowed.losses, each.losses);
  ASSERT_TRUE(each.last_eval && windowed.last_eval);
  EXPECT_EQ(windowed.last_eval->loss, each.last_eval->loss);
}

}  // namespace
}  // namespace cpf::trainer
