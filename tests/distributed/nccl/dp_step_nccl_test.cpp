// A data-parallel training step over NCCL, rank r on cuda:r (apps/trainer/step/step_prefetch.h; docs/training.md,
// "Host synchronisation in a step"). With the label count and the stop signal agreed a step ahead, a warm
// step of each rank reads nothing back with a device->host copy and waits for one event (its
// StepReadback); without the read-ahead each step also copies the count back before its forward. Both
// give the same losses and parameters (to rounding: NCCL and the kernels need not be bitwise
// reproducible between two runs). Two micro-batches a step. Skips below 2 GPUs.
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "tests/distributed/nccl/nccl_test_utils.h"
#if CPF_HAVE_TRAINER
#include "apps/trainer/step/step_prefetch.h"
#include "apps/trainer/step/training_step.h"
#include "framework/optim/adamw.h"
#include "framework/tensor/cuda/cuda.h"
#endif

namespace cpf::testing {
namespace {

#if CPF_HAVE_TRAINER
using trainer::RankGroups;
using trainer::StepParts;
using trainer::StepPrefetch;

class DataParallelStepNccl : public MultiGpuTest {};

// The rank threads meet here without any device work (so nothing is counted); bounded, so a rank that
// failed cannot leave the other waiting for ever.
class HostRendezvous {
 public:
  void arrive_and_wait(int ranks) {
    const int target = (arrivals_.fetch_add(1) / ranks + 1) * ranks;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (arrivals_.load() < target) {
      if (std::chrono::steady_clock::now() > deadline) throw std::runtime_error("HostRendezvous: a rank never came");
      std::this_thread::yield();
    }
  }

 private:
  std::atomic<int> arrivals_{0};
};

models::data::DataOptions step_data() {
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

int no_stop_signal() { return 0; }

constexpr int kWarmSteps = 3, kMeasuredSteps = 4;

struct StepRun {
  std::vector<double> losses;               // rank 0's
  std::vector<std::vector<double>> params;  // rank 0's after the last step
  cuda::HostSyncCounts measured{};          // both ranks' steps after the warm ones
};

StepRun data_parallel_steps(bool read_ahead) {
  StepRun run;
  std::mutex mu;
  HostRendezvous rendezvous;
  cuda::HostSyncCounts before{};
  run_nccl(2, [&](dist::RankContext& ctx) {
    RankGroups g;
    g.world = ctx.world;
    g.dp_rank = ctx.rank;
    g.dp_size = 2;
    Generator gen(5);
    models::GPT model(models::GPTOptions{.vocab_size = 14, .hidden_size = 32, .num_layers = 2, .num_heads = 2}, &gen);
    model.to(ctx.device);
    const optim::NamedTensors params = model.named_parameters();
    std::vector<Tensor> tensors;
    for (const auto& [name, t] : params) tensors.push_back(t);
    dist::GradientReducer reducer(tensors, ctx.world, dist::GradientReducerOptions{.op = dist::ReduceOp::sum});
    models::data::DataLoader loader(step_data(), g.dp_rank, 2);
    optim::AdamW adamw(params, optim::AdamWOptions{.lr = 1e-2});
    const optim::LrSchedule schedule(optim::LrScheduleOptions{.decay = optim::LrDecay::constant, .lr = 1e-2});
    StepPrefetch prefetch(no_stop_signal);
    const StepParts parts{.model = model,
                          .loader = loader,
                          .groups = g,
                          .reducer = &reducer,
                          .params = params,
                          .optimizer = adamw,
                          .schedule = schedule,
                          .accum_steps = 2,
                          .grad_clip = 0.01,
                          .prefetch = read_ahead ? &prefetch : nullptr};
    std::vector<double> losses;
    for (int64_t step = 0; step < kWarmSteps + kMeasuredSteps; ++step) {
      if (step == kWarmSteps) {  // warm: the allocator's cache, the attention tables, NCCL's connections
        rendezvous.arrive_and_wait(2);
        if (ctx.rank == 0) before = cuda::host_sync_counts();
        rendezvous.arrive_and_wait(2);
      }
      losses.push_back(trainer::training_step(parts, step).loss);
    }
    rendezvous.arrive_and_wait(2);
    if (ctx.rank != 0) return;
    std::lock_guard lock(mu);
    run.measured = cuda::host_sync_counts() - before;
    run.losses = losses;
    for (const auto& [name, t] : params) run.params.push_back(t.to_vector<double>());
  });
  return run;
}

TEST_F(DataParallelStepNccl, AWarmStepWaitsForItsReadBackEventOnlyAndTrainsAsBefore) {
  const StepRun counted_first = data_parallel_steps(false);
  const StepRun ahead = data_parallel_steps(true);
  const std::string counts = "read ahead: " + cuda::to_string(ahead.measured) +
                             "; counted first: " + cuda::to_string(counted_first.measured) + " (" +
                             std::to_string(kMeasuredSteps) + " steps of 2 ranks)";
  std::printf("%s\n", counts.c_str());
  EXPECT_EQ(ahead.measured.device_to_host, 0u) << counts;
  EXPECT_EQ(ahead.measured.stream_syncs, 2u * kMeasuredSteps) << counts;
  EXPECT_EQ(ahead.measured.device_syncs, 0u) << counts;
  EXPECT_GE(counted_first.measured.device_to_host, 2u * kMeasuredSteps)
      << counts << ": the count read before the forward";
  ASSERT_EQ(ahead.losses.size(), counted_first.losses.size());
  for (size_t i = 0; i < ahead.losses.size(); ++i) {
    EXPECT_NEAR(ahead.losses[i], counted_first.losses[i], 1e-5 * std::abs(counted_first.losses[i])) << "step " << i;
    if (i > 0) EXPECT_NE(counted_first.losses[i], counted_first.losses[i - 1]) << "every step's batches differ";
  }
  ASSERT_EQ(ahead.params.size(), counted_first.params.size());
  for (size_t p = 0; p < ahead.params.size(); ++p) {
    for (size_t i = 0; i < ahead.params[p].size(); ++i) {
      ASSERT_NEAR(ahead.params[p][i], counted_first.params[p][i], 1e-5) << "parameter " << p << "[" << i << "]";
    }
  }
}
#else
TEST(DataParallelStepNccl, NeedsTheTrainer) {
  GTEST_SKIP() << "built without apps/ (CPF_BUILD_APPS=OFF): no trainer to test";
}
#endif

}  // namespace
}  // namespace cpf::testing
