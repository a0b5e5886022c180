// The trainer's step profiler (apps/report/step_profiler.h): its window, its per-step table and its
// refusals, on CPU scopes (the GPU columns are covered by tests/tensor/cuda/profile_test.cpp's timers).
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "apps/report/step_profiler.h"
#include "framework/core/error.h"

namespace cpf::trainer {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

void fake_step() {
  const profile::Scope step("step");
  {
    const profile::Scope forward("phase/forward");
    const profile::Scope op("forward/linear");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const profile::Scope backward("phase/backward");
  std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

TEST(StepProfiler, ProfilesTheWindowAfterTheFirstStepAndWritesTheTable) {
  const std::string path = (std::filesystem::temp_directory_path() / "cpf_step_profiler_test.txt").string();
  StepProfiler profiler(2, 10, 20, Device::cpu(), path);  // a run resumed at step 10: steps 12 and 13
  EXPECT_FALSE(profiler.active(11));
  EXPECT_TRUE(profiler.active(12));
  EXPECT_TRUE(profiler.active(13));
  EXPECT_FALSE(profiler.active(14));
  std::optional<std::string> table;
  for (int64_t step = 11; step <= 14; ++step) {
    profiler.begin_step(step);
    fake_step();
    auto out = profiler.end_step(step);
    if (step != 13) EXPECT_FALSE(out.has_value()) << step;
    if (out) table = out;
  }
  ASSERT_TRUE(table.has_value());
  EXPECT_FALSE(profile::enabled());
  EXPECT_NE(table->find("profile: steps 12-13 on cpu"), std::string::npos) << *table;
  // Phases in step order before the ops; one call per step each; the step is 100% of itself.
  const size_t step_row = table->find("\nstep "), fwd = table->find("phase/forward"),
               bwd = table->find("phase/backward"), op = table->find("forward/linear");
  ASSERT_NE(op, std::string::npos) << *table;
  EXPECT_LT(step_row, fwd);
  EXPECT_LT(fwd, bwd);
  EXPECT_LT(bwd, op);
  EXPECT_NE(table->find("100.0%"), std::string::npos) << *table;
  EXPECT_EQ(read_file(path), *table);
  std::filesystem::remove(path);
}

TEST(StepProfiler, RowsPerStepAndShares) {
  std::vector<profile::Stats> stats{{.name = "forward/linear", .calls = 8, .host_total_ms = 4},
                                    {.name = "step", .calls = 2, .host_total_ms = 20},
                                    {.name = "phase/forward", .calls = 2, .host_total_ms = 12}};
  const auto rows = per_step_rows(stats, 2);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].name, "step");
  EXPECT_EQ(rows[1].name, "phase/forward");
  EXPECT_DOUBLE_EQ(rows[1].host_ms_per_step, 6);
  EXPECT_DOUBLE_EQ(rows[1].share, 0.6);
  EXPECT_DOUBLE_EQ(rows[2].calls_per_step, 4);
  EXPECT_DOUBLE_EQ(rows[2].gpu_ms_per_step, -1);
}

// The ops' reported work over a row's time: TFLOP/s and GB/s columns, "-" where nothing was reported.
TEST(StepProfiler, AchievedRatesPerRow) {
  std::vector<profile::Stats> stats{
      {.name = "step", .calls = 2, .host_total_ms = 20},
      {.name = "forward/linear", .calls = 8, .host_total_ms = 4, .flops = 8e9, .bytes = 4e6}};
  const auto rows = per_step_rows(stats, 2);
  ASSERT_EQ(rows[1].name, "forward/linear");
  EXPECT_DOUBLE_EQ(rows[1].tflops, 2.0);  // 4e9 FLOPs a step in 2 ms
  EXPECT_DOUBLE_EQ(rows[1].gbps, 1.0);    // 2e6 bytes a step in 2 ms
  EXPECT_DOUBLE_EQ(rows[0].tflops, 0);
  const std::string table = format_profile(rows, 0, 2, "cpu");
  EXPECT_NE(table.find("TFLOP/s      GB/s"), std::string::npos) << table;
  EXPECT_NE(table.find("         2         1\n"), std::string::npos) << table;
}

TEST(StepProfiler, TheHeaderSaysWhereTheTimesComeFrom) {
  const std::vector<ProfileRow> rows;
  EXPECT_NE(format_profile(rows, 1, 3, "cpu").find("steps 2-4 on cpu, per step (no GPU: host wall time only;"),
            std::string::npos);
  EXPECT_NE(format_profile(rows, 1, 3, "cuda:0").find("on cuda:0, per step (GPU time from CUDA events;"),
            std::string::npos);
}

TEST(StepProfiler, AWindowPastTheRunIsRefusedWithTheFix) {
  try {
    StepProfiler profiler(10, 0, 5, Device::cpu(), "unused");
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("run.profile=10 profiles steps 2-11 (the run's first step is left out) but "
                                         "the run ends at step 5: lower run.profile to at most 4 or raise run.steps"),
              std::string::npos)
        << e.what();
  }
  try {
    StepProfiler profiler(-1, 0, 5, Device::cpu(), "unused");
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("run.profile=-1 must be 0 (off)"), std::string::npos) << e.what();
  }
  StepProfiler off(0, 0, 1, Device::cpu(), "unused");
  EXPECT_FALSE(off.active(1));
  EXPECT_FALSE(off.end_step(1).has_value());
}

}  // namespace
}  // namespace cpf::trainer
