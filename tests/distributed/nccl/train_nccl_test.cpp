// Training on several GPUs over NCCL (skips below the GPUs a case needs):
//   - dp x cp training (trainer::train in this process, parallel.backend nccl, rank r on cuda:r) for 20
//     steps follows the single-GPU loss curve with the same global batch: dp=2 cp=1, dp=1 cp=2 (p2p and
//     a2a) on 2 GPUs; dp=2 cp=2 (p2p) and dp=1 cp=4 (a2a+p2p) on 4 GPUs; fp32, bf16 and fp8 (current
//     and delayed scaling, whose amaxes are reduced over the ranks) each;
//   - two processes started through the launcher environment (dist::spawn_local_processes running the
//     cpformer binary, which joins with dist::init_from_environment) log the same losses as
//     `cpformer train --gpus 2` (one process, two rank threads);
//   - a rank killed mid-training (SIGKILL after its peers logged step 5): the survivor exits non-zero
//     naming rank 1, well before the launcher's SIGKILL, and spawn_local_processes blames rank 1.
//
// The model is a 2-layer Llama-style GPT (hidden 128, 4 heads of 32) on 1-3 digit addition in bshd
// windows of 64 tokens (every row full), 4 rows per DP rank per step. The single-GPU reference reads
// dp x 4 rows per step: DP rank r takes global batch dp s + r of the stream, so one rank with the
// dp-fold batch sees the same rows in one piece (tests/apps/trainer/train_test.cpp checks that on the CPU).
//
// cpformer binary: $CPF_CPFORMER_BIN, else `cpformer` next to this test binary (scripts/gpu/build.sh
// with WITH_APPS=1 puts it there), else the build tree's apps/cpformer this test was compiled with.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/distributed/nccl/nccl_test_utils.h"
#if CPF_HAVE_TRAINER
#include "apps/cli/cli.h"
#include "apps/trainer/trainer.h"
#include "framework/distributed/process_launcher.h"
#endif

namespace cpf::trainer {
namespace {

#if CPF_HAVE_TRAINER

namespace fs = std::filesystem;
using ::cpf::testing::MultiGpuTest;

constexpr int64_t kRowsPerDpRank = 4;

// Bounds on |loss - reference| / reference, step by step (both runs in the same precision).
// Step 1 runs identical weights (drawn on the CPU from the seed) on the same tokens: only the order of
// sums differs (a GEMM over 4 rows instead of 8, a ring's LSE merge, NCCL's all-reduce of the loss).
//   fp32 (TF32 off): rounding at 2^-24 per operation; 1e-5 leaves two orders of magnitude.
//   bf16: activations and GEMM outputs are rounded to 8 mantissa bits (2^-9 relative); a kernel chosen
//         for another shape rounds a few elements the other way, and the loss, a mean over thousands
//         of tokens, moves by far less than one bf16 step: 2e-3.
// Later steps add 19 AdamW updates, whose normalisation by sqrt(v) turns rounding noise in small
// gradients into full-size steps for those elements, so the curves drift apart slowly: fp32 2e-4,
// bf16 5e-3 ("a few bf16 steps"). What these catch: a batch row lost or read twice, a missing or
// doubled gradient reduction, a wrong CP shard or merge move the loss by 1e-2 or more (step 1 for
// data and loss-scaling errors, within a few steps for gradient errors).
struct Bound {
  double first_step, later_steps;
};
constexpr Bound kFp32Bound{1e-5, 2e-4};
constexpr Bound kBf16Bound{2e-3, 5e-3};
//   fp8 (run.precision: fp8, both recipes): activations and weights are cast to E4M3 (3 mantissa bits,
//         2^-4 relative) with per-tensor scales. Under current scaling each rank scales its own rows (their
//         amax, not the whole batch's), so the quantised values differ from the single GPU's, not only the
//         order of sums; delayed scaling does that on step 1 only (its later scales come from amaxes
//         max-reduced over the ranks, the single GPU's). Each element moves by up to a code; the loss, a mean
//         over every token, by about 1e-3: 1e-2 on step 1, and 5e-2 later (the CPU tests' bound between FP8
//         and bf16 curves, tests/apps/trainer/fp8_training_test.cpp).
constexpr Bound kFp8Bound{1e-2, 5e-2};

// The precisions every layout trains in, with the overrides that select them.
struct PrecisionCase {
  const char* name;
  std::vector<std::string> overrides;
  Bound bound;
};
const std::vector<PrecisionCase>& precision_cases() {
  static const std::vector<PrecisionCase> cases = {
      {"fp32", {"run.precision=fp32"}, kFp32Bound},
      {"bf16", {"run.precision=bf16"}, kBf16Bound},
      {"fp8_current", {"run.precision=fp8"}, kFp8Bound},
      {"fp8_delayed", {"run.precision=fp8", "fp8.recipe=delayed"}, kFp8Bound}};
  return cases;
}

fs::path scratch(const std::string& name) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string test = std::string(info->test_suite_name()) + "." + info->name();
  for (char& ch : test) {
    if (ch == '/') ch = '_';
  }
  const fs::path dir = fs::temp_directory_path() / "cpformer_multi_gpu_tests" / (test + "." + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string yaml(int64_t steps) {
  return "run:\n  steps: " + std::to_string(steps) +
         "\n  log_every: 1\n  eval_every: 0\n  eval_batches: 1\n  eval_examples: 0\n  threads: 1\n"
         "  resume: never\n  device: cuda\n"
         "model:\n  hidden_size: 128\n  num_layers: 2\n  num_heads: 4\n  mlp: swiglu\n  norm: rmsnorm\n"
         "  positions: rope\n"
         "optimizer:\n  lr: 0.003\n"
         "schedule:\n  warmup_steps: 2\n  total_steps: 20\n"
         "data:\n  source: synthetic\n  task: addition\n  min_len: 1\n  max_len: 3\n  layout: bshd\n"
         "  bshd_fill: window\n  seq_len: 64\n  batch_size: " +
         std::to_string(kRowsPerDpRank) + "\n  pad_multiple: 8\n";
}

std::vector<double> train_losses(int64_t steps, std::vector<std::string> overrides, const std::string& dir_name) {
  overrides.push_back("run.out_dir=" + scratch(dir_name).string());
  const TrainConfig c = load_train_config_string(yaml(steps), "multi_gpu_test.yaml", overrides);
  std::ostringstream out;
  return train(c, out).losses;
}

// The single-GPU run (one rank, thread backend, cuda:0) in `precision` reading `rows` rows per step;
// computed once.
const std::vector<double>& single_gpu_losses(const PrecisionCase& precision, int64_t rows) {
  static std::map<std::string, std::vector<double>> cache;
  const std::string key = std::string(precision.name) + "_rows" + std::to_string(rows);
  auto it = cache.find(key);
  if (it == cache.end()) {
    std::vector<std::string> overrides = precision.overrides;
    overrides.push_back("data.batch_size=" + std::to_string(rows));
    it = cache.emplace(key, train_losses(20, overrides, "single_" + key)).first;
  }
  return it->second;
}

// Prints both curves (a record of the measured drift) and checks each step against `bound`.
void expect_tracks(const std::vector<double>& run, const std::vector<double>& reference, Bound bound,
                   const std::string& what) {
  ASSERT_EQ(run.size(), reference.size()) << what;
  std::printf("[train nccl] %s: step | single GPU | this run | relative difference\n", what.c_str());
  double worst = 0;
  for (size_t i = 0; i < reference.size(); ++i) {
    const double rel = std::abs(run[i] - reference[i]) / std::abs(reference[i]);
    worst = std::max(worst, rel);
    std::printf("[train nccl]   %2zu | %.8f | %.8f | %.2e\n", i + 1, reference[i], run[i], rel);
    const double allowed = i == 0 ? bound.first_step : bound.later_steps;
    EXPECT_LE(rel, allowed) << what << ": step " << i + 1 << " loss " << run[i] << " vs single GPU " << reference[i]
                            << " (relative difference " << rel << ", bound " << allowed << ")";
  }
  std::printf("[train nccl] %s: largest relative difference %.2e\n", what.c_str(), worst);
  // The run must also learn (a run that diverged would not match anyway; this names it).
  EXPECT_LT(run.back(), 0.9 * run.front()) << what << ": the loss did not fall";
}

struct Layout {
  int dp, cp;
  const char* comm;
};

std::string layout_name(const Layout& l) {
  std::string name = "dp" + std::to_string(l.dp) + "_cp" + std::to_string(l.cp);
  if (l.cp > 1) name += std::string("_") + l.comm;
  for (char& ch : name) {
    if (ch == '+') ch = '_';
  }
  return name;
}

class DataContextParallelNccl : public MultiGpuTest, public ::testing::WithParamInterface<Layout> {};

TEST_P(DataContextParallelNccl, TwentyStepsFollowTheSingleGpuLossCurve) {
  const Layout& l = GetParam();
  const int gpus = cuda::device_count();
  if (gpus < l.dp * l.cp) {
    GTEST_SKIP() << layout_name(l) << " needs " << l.dp * l.cp << " GPUs, " << gpus
                 << " visible: it runs on the 4-GPU machine (nvidia-h200-x4)";
  }
  for (const PrecisionCase& precision : precision_cases()) {
    const std::string what = layout_name(l) + " " + precision.name + " over NCCL";
    std::vector<std::string> overrides = precision.overrides;
    overrides.insert(overrides.end(),
                     {std::string("parallel.backend=nccl"), "parallel.dp=" + std::to_string(l.dp),
                      "parallel.cp=" + std::to_string(l.cp), std::string("parallel.cp_comm_type=") + l.comm});
    std::vector<double> losses;
    try {
      losses = train_losses(20, overrides, layout_name(l) + "_" + precision.name);
    } catch (const std::exception& e) {
      ADD_FAILURE() << what << ": training failed: " << e.what();
      continue;
    }
    expect_tracks(losses, single_gpu_losses(precision, l.dp * kRowsPerDpRank), precision.bound, what);
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, DataContextParallelNccl,
                         ::testing::Values(Layout{2, 1, "p2p"}, Layout{1, 2, "p2p"}, Layout{1, 2, "a2a"},
                                           Layout{2, 2, "p2p"}, Layout{1, 4, "a2a+p2p"}),
                         [](const ::testing::TestParamInfo<Layout>& info) { return layout_name(info.param); });

// ---- one process per rank through the environment ----

std::string self_executable() {
  char path[4096];
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0) return "";
  path[n] = '\0';
  return path;
}

// The cpformer binary (see the file comment), or "" with `looked` listing where it was looked for.
std::string cpformer_binary(std::string* looked) {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("CPF_CPFORMER_BIN"); env && *env) candidates.push_back(env);
  candidates.push_back((fs::path(self_executable()).parent_path() / "cpformer").string());
#ifdef CPF_CPFORMER_BIN
  candidates.push_back(CPF_CPFORMER_BIN);
#endif
  for (const std::string& c : candidates) {
    *looked += (looked->empty() ? "" : ", ") + c;
    if (::access(c.c_str(), X_OK) == 0) return c;
  }
  return "";
}

// Training losses from a run folder's metrics.jsonl (step lines carry "lr"; eval lines do not).
std::vector<double> logged_losses(const fs::path& run_dir) {
  std::ifstream in(run_dir / "metrics.jsonl");
  std::vector<double> losses;
  for (std::string line; std::getline(in, line);) {
    const size_t at = line.find("\"loss\":");
    if (line.find("\"lr\":") == std::string::npos || at == std::string::npos) continue;
    losses.push_back(std::strtod(line.c_str() + at + 7, nullptr));
  }
  return losses;
}

class ProcessLaunchNccl : public MultiGpuTest {
 protected:
  void SetUp() override {
    MultiGpuTest::SetUp();
    if (IsSkipped()) return;
    std::string looked;
    bin_ = cpformer_binary(&looked);
    ASSERT_FALSE(bin_.empty()) << "no cpformer binary at " << looked
                               << ": build the GPU carry with WITH_APPS=1 scripts/gpu/build.sh (it copies cpformer "
                                  "next to the tests) or set CPF_CPFORMER_BIN";
    config_ = (scratch("config") / "train.yaml").string();
    std::ofstream(config_) << yaml(2000);
  }
  dist::SpawnOptions capture(std::chrono::milliseconds grace) {
    dist::SpawnOptions options;
    options.grace = grace;
    options.output = [this](int rank, std::string_view line) {
      std::lock_guard lock(mutex_);
      lines_ += "[rank " + std::to_string(rank) + "] " + std::string(line) + "\n";
    };
    return options;
  }
  std::string output() {
    std::lock_guard lock(mutex_);
    return lines_;
  }
  void clear_output() {
    std::lock_guard lock(mutex_);
    lines_.clear();
  }
  std::string bin_, config_;
  std::mutex mutex_;
  std::string lines_;
};

// The same 10 bf16 steps, started two ways, must log the same losses (dp = 2, then cp = 2).
// attention.deterministic makes cuDNN's backward bitwise reproducible (tests/tensor/cuda/training_test.cpp checks
// that on one GPU), and with 2 ranks every NCCL sum is a single a + b, so the runs are expected to agree
// bit for bit; 1e-6 relative leaves room only for a different library path, not for a different step.
TEST_F(ProcessLaunchNccl, TwoProcessesLogTheLossesOfTheSingleCommand) {
  for (const std::string parallel : {"parallel.cp=1", "parallel.cp=2"}) {
    SCOPED_TRACE(parallel);
    const std::vector<std::string> common = {"--set", "run.steps=10",       "--set", parallel,
                                             "--set", "run.precision=bf16", "--set", "attention.deterministic=true"};
    const fs::path one_dir = scratch("one_command_" + parallel.substr(9));
    std::vector<std::string> args = {"train", config_, "--gpus", "2", "--set", "run.out_dir=" + one_dir.string()};
    args.insert(args.end(), common.begin(), common.end());
    std::ostringstream out, err;
    ASSERT_EQ(run_cli(args, out, err), kExitOk) << "cpformer train --gpus 2\n" << out.str() << err.str();

    const fs::path spawned_dir = scratch("two_processes_" + parallel.substr(9));
    std::vector<std::string> argv = {bin_,
                                     "train",
                                     config_,
                                     "--set",
                                     "parallel.backend=nccl",
                                     "--set",
                                     parallel == "parallel.cp=1" ? "parallel.dp=2" : "parallel.dp=1",
                                     "--set",
                                     "run.out_dir=" + spawned_dir.string()};
    argv.insert(argv.end(), common.begin(), common.end());
    const dist::SpawnResult r = dist::spawn_local_processes(2, argv, capture(std::chrono::seconds(5)));
    const std::string log = output();
    ASSERT_EQ(r.exit_code, 0) << r.message << "\n" << log;
    EXPECT_NE(log.find("[rank 0] cpformer train: "), std::string::npos) << log;
    EXPECT_NE(log.find("one process per rank"), std::string::npos) << log;
    EXPECT_NE(log.find("[rank 0] done: step 10/10"), std::string::npos) << log;

    const std::vector<double> one = logged_losses(one_dir), two = logged_losses(spawned_dir);
    ASSERT_EQ(one.size(), 10u) << "metrics.jsonl of cpformer train --gpus 2 in " << one_dir << "\n" << out.str();
    ASSERT_EQ(two.size(), 10u) << "metrics.jsonl of the two processes in " << spawned_dir << "\n" << log;
    for (size_t i = 0; i < one.size(); ++i) {
      EXPECT_LE(std::abs(two[i] - one[i]), 1e-6 * std::abs(one[i]))
          << "step " << i + 1 << ": two processes " << two[i] << " vs --gpus 2 " << one[i];
      if (two[i] != one[i])
        std::printf("[train nccl] %s step %zu not bit-identical: %.17g vs %.17g\n", parallel.c_str(), i + 1, two[i],
                    one[i]);
    }
    clear_output();
  }
}

// Rank 1 is killed with SIGKILL once rank 0 has logged 5 steps (a watcher in its wrapper shell).
// Every rank ignores SIGTERM (`trap '' TERM` survives exec), as a survivor that must report would: so
// rank 0 is not terminated by the launcher but must leave on its own, through the rendezvous's
// liveness channel, with cpformer's error naming rank 1, long before the 60 s grace ends in SIGKILL.
TEST_F(ProcessLaunchNccl, KilledRankIsNamedAndTheSurvivorExitsNonZero) {
  const fs::path dir = scratch("run");
  const fs::path killed = dir.parent_path() / (dir.filename().string() + ".killed");
  fs::remove(killed);
  const std::string script =
      "trap '' TERM\n"
      "if [ \"$RANK\" = 1 ]; then\n"
      "  (\n"
      "    i=0; n=0\n"
      "    while [ $i -lt 1200 ]; do\n"
      "      n=$(grep -c '\"lr\"' \"$CPF_TEST_METRICS\" 2>/dev/null)\n"
      "      [ \"${n:-0}\" -ge 5 ] && break\n"
      "      sleep 0.1; i=$((i + 1))\n"
      "    done\n"
      "    echo \"${n:-0}\" > \"$CPF_TEST_KILLED\"\n"
      "    kill -KILL $$\n"
      "  ) &\n"
      "  exec \"$@\"\n"
      "fi\n"
      "\"$@\"\n"
      "rc=$?\n"
      "echo \"CPFORMER EXIT $rc\"\n"
      "exit $rc\n";
  dist::SpawnOptions options = capture(std::chrono::seconds(60));
  options.extra_env = {{"CPF_TEST_METRICS", (dir / "metrics.jsonl").string()}, {"CPF_TEST_KILLED", killed.string()}};
  // When the watcher fired (the marker file appears just before the kill).
  std::atomic<bool> done{false};
  std::atomic<int64_t> killed_at_ms{-1};
  const auto start = std::chrono::steady_clock::now();
  auto ms_since_start = [&] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
  };
  std::thread watch([&] {
    while (!done && killed_at_ms < 0) {
      if (fs::exists(killed)) killed_at_ms = ms_since_start();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  const dist::SpawnResult r = dist::spawn_local_processes(
      2,
      {"/bin/sh", "-c", script, "sh", bin_, "train", config_, "--set", "parallel.backend=nccl", "--set",
       "parallel.dp=2", "--set", "run.out_dir=" + dir.string()},
      options);
  const int64_t ended_ms = ms_since_start();
  done = true;
  watch.join();
  const std::string log = output();

  std::ifstream marker(killed);
  int steps_before_kill = -1;
  marker >> steps_before_kill;
  ASSERT_GE(steps_before_kill, 5) << "rank 1 was killed before rank 0 logged 5 steps (the run did not train?)\n" << log;
  EXPECT_EQ(r.failed_rank, 1) << r.message << "\n" << log;
  EXPECT_EQ(r.exit_code, 128 + 9) << r.message;
  EXPECT_NE(r.message.find("rank 1 was killed by signal 9"), std::string::npos) << r.message;
  EXPECT_NE(log.find("[rank 0] cpformer: error: "), std::string::npos) << "rank 0 printed no error\n" << log;
  EXPECT_NE(log.find("rank 1 failed: its process ended"), std::string::npos) << "rank 0's error does not name rank 1\n"
                                                                             << log;
  EXPECT_NE(log.find("[rank 0] CPFORMER EXIT 1"), std::string::npos) << "rank 0 did not exit with status 1\n" << log;
  ASSERT_GE(killed_at_ms.load(), 0) << log;
  const double seconds = (ended_ms - killed_at_ms.load()) / 1000.0;
  std::printf("[train nccl] rank 1 killed after %d logged steps; rank 0 exited %.2f s later\n", steps_before_kill,
              seconds);
  EXPECT_LT(seconds, 30.0) << "rank 0 should leave within seconds through the rendezvous, not at the launcher's "
                              "SIGKILL (60 s grace)\n"
                           << log;
}

// SIGTERM reaches rank 1 only (a watcher in its wrapper shell fires once rank 0 has logged 3 steps): the
// ranks agree to stop after the same step (rank 0 never got a signal), rank 0 writes the checkpoint of
// that step and says how to resume, and the run exits 143. `cpformer train --gpus 2` then continues it.
TEST_F(ProcessLaunchNccl, SigtermToOneRankStopsEveryRankAfterACheckpoint) {
  const fs::path dir = scratch("run");
  const std::string script =
      "if [ \"$RANK\" = 1 ]; then\n"
      "  (\n"
      "    i=0\n"
      "    while [ $i -lt 1200 ]; do\n"
      "      [ \"$(grep -c '\"lr\"' \"$CPF_TEST_METRICS\" 2>/dev/null)\" -ge 3 ] 2>/dev/null && break\n"
      "      sleep 0.1; i=$((i + 1))\n"
      "    done\n"
      "    kill -TERM $$\n"
      "  ) &\n"
      "fi\n"
      "exec \"$@\"\n";
  dist::SpawnOptions options = capture(std::chrono::seconds(60));
  options.extra_env = {{"CPF_TEST_METRICS", (dir / "metrics.jsonl").string()}};
  const dist::SpawnResult r = dist::spawn_local_processes(
      2,
      {"/bin/sh", "-c", script, "sh", bin_, "train", config_, "--set", "parallel.backend=nccl", "--set",
       "parallel.dp=2", "--set", "run.out_dir=" + dir.string()},
      options);
  const std::string log = output();
  EXPECT_EQ(r.exit_code, 143) << r.message << "\n" << log;
  const std::string stopped = "[rank 0] stopped by SIGTERM after step ";
  const size_t at = log.find(stopped);
  ASSERT_NE(at, std::string::npos) << log;
  const int64_t step = std::stoll(log.substr(at + stopped.size()));
  ASSERT_GE(step, 3) << log;
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(step));
  const fs::path checkpoint = dir / "checkpoints" / name;
  EXPECT_NE(log.find("/2000: checkpoint " + checkpoint.string()), std::string::npos) << log;
  EXPECT_TRUE(fs::exists(checkpoint / "meta.json")) << log;
  EXPECT_NE(log.find("[rank 0] resume with: cpformer train " + config_), std::string::npos) << log;

  std::ostringstream out, err;
  ASSERT_EQ(run_cli({"train", config_, "--gpus", "2", "--set", "run.out_dir=" + dir.string(), "--set",
                     "run.resume=auto", "--set", "run.steps=" + std::to_string(step + 2)},
                    out, err),
            kExitOk)
      << out.str() << err.str();
  EXPECT_NE(out.str().find("resumed from " + checkpoint.string() + " at step " + std::to_string(step)),
            std::string::npos)
      << out.str();
  EXPECT_NE(out.str().find("done: step " + std::to_string(step + 2) + "/"), std::string::npos) << out.str();
}

#else  // built without the apps (CPF_BUILD_APPS=OFF): no trainer to drive

TEST(TrainNccl, NeedsTheTrainer) { GTEST_SKIP() << "built without apps/ (CPF_BUILD_APPS=OFF): no trainer to test"; }

#endif

}  // namespace
}  // namespace cpf::trainer
