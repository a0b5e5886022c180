// cpf::profile (framework/tensor/profile.h): the recording switch, host times of nested scopes and of
// scopes on several threads, the device hooks (ranges, event timers read late), the table and its text.
// Fake device hooks stand in for the CUDA backend so every path runs on the CPU.
#include "framework/tensor/profile.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "framework/core/error.h"

namespace cpf::profile {
namespace {

// What the fake backend saw; timers are indices into `timers`.
struct FakeDevice {
  std::vector<std::string> ranges;  // "push NAME" / "pop"
  struct Timer {
    int device = 0;
    bool stopped = false;
    int polls = 0;
    bool released = false;
  };
  std::vector<Timer> timers;
};
FakeDevice* g_fake = nullptr;

DeviceHooks fake_hooks() {
  DeviceHooks h;
  h.range_push = [](const char* name) { g_fake->ranges.push_back(std::string("push ") + name); };
  h.range_pop = [] { g_fake->ranges.push_back("pop"); };
  h.timer_start = [](Device d) -> void* {
    g_fake->timers.push_back({.device = d.index});
    return reinterpret_cast<void*>(g_fake->timers.size());  // 1-based: never null
  };
  h.timer_stop = [](void* t) { g_fake->timers[reinterpret_cast<size_t>(t) - 1].stopped = true; };
  // Not done at the first poll (the scope's end), done when waited for: 2.5 ms each.
  h.timer_elapsed_ms = [](void* t, bool wait) {
    FakeDevice::Timer& timer = g_fake->timers[reinterpret_cast<size_t>(t) - 1];
    EXPECT_TRUE(timer.stopped);
    return wait || timer.polls++ > 0 ? 2.5 : -1.0;
  };
  h.timer_release = [](void* t) { g_fake->timers[reinterpret_cast<size_t>(t) - 1].released = true; };
  return h;
}

class Profile : public ::testing::Test {
 protected:
  void SetUp() override {
    g_fake = &fake_;
    register_device_hooks(DeviceType::cuda, fake_hooks());
    reset();
  }
  void TearDown() override {
    set_enabled(false);
    reset();
    register_device_hooks(DeviceType::cuda, DeviceHooks{});
    g_fake = nullptr;
  }
  FakeDevice fake_;
};

const Stats* find(const std::vector<Stats>& stats, const std::string& name) {
  for (const Stats& s : stats) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

TEST_F(Profile, DisabledScopesOpenRangesButRecordNothing) {
  { Scope scope("quiet", Device::cuda(0)); }
  EXPECT_TRUE(snapshot().empty());
  EXPECT_THAT(fake_.ranges, ::testing::ElementsAre("push quiet", "pop"));
  EXPECT_TRUE(fake_.timers.empty());
}

TEST_F(Profile, NestedScopesCountCallsAndHostTime) {
  set_enabled(true);
  for (int i = 0; i < 3; ++i) {
    Scope outer("outer");
    Scope inner("inner");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const std::vector<Stats> stats = snapshot();
  ASSERT_EQ(stats.size(), 2u);
  EXPECT_EQ(stats[0].name, "inner");  // rows are in the order their names first closed
  const Stats* outer = find(stats, "outer");
  const Stats* inner = find(stats, "inner");
  ASSERT_TRUE(outer && inner);
  EXPECT_EQ(outer->calls, 3);
  EXPECT_EQ(inner->calls, 3);
  EXPECT_GE(inner->host_total_ms, 15.0);
  EXPECT_GE(outer->host_total_ms, inner->host_total_ms);
  EXPECT_GE(inner->host_max_ms, 5.0);
  EXPECT_LE(inner->host_max_ms, inner->host_total_ms);
  EXPECT_EQ(outer->gpu_calls, 0);
  EXPECT_THAT(fake_.ranges, ::testing::ElementsAre("push outer", "push inner", "pop", "pop", "push outer", "push inner",
                                                   "pop", "pop", "push outer", "push inner", "pop", "pop"));
}

TEST_F(Profile, ScopesOnManyThreadsShareOneTable) {
  register_device_hooks(DeviceType::cuda, DeviceHooks{});  // the fake is not thread-safe
  set_enabled(true);
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([] {
      for (int i = 0; i < 250; ++i) Scope scope("rank work");
    });
  }
  for (auto& t : threads) t.join();
  const std::vector<Stats> stats = snapshot();
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_EQ(stats[0].calls, 1000);
}

TEST_F(Profile, DeviceScopesTimeWithEventsReadLate) {
  set_enabled(true);
  { Scope scope("step", Device::cuda(1)); }
  { Scope scope("step", Device::cuda(1)); }
  { Scope scope("host only", Device::cpu()); }
  ASSERT_EQ(fake_.timers.size(), 2u);  // the CPU device starts no timer
  EXPECT_EQ(fake_.timers[0].device, 1);
  // The first timer was polled (not done) at its scope's end and read done at the second's end.
  EXPECT_TRUE(fake_.timers[0].released);
  EXPECT_FALSE(fake_.timers[1].released);
  const std::vector<Stats> stats = snapshot();  // waits for the second
  EXPECT_TRUE(fake_.timers[1].released);
  const Stats* step = find(stats, "step");
  ASSERT_TRUE(step);
  EXPECT_EQ(step->calls, 2);
  EXPECT_EQ(step->gpu_calls, 2);
  EXPECT_DOUBLE_EQ(step->gpu_total_ms, 5.0);
  EXPECT_DOUBLE_EQ(step->gpu_max_ms, 2.5);
  EXPECT_EQ(find(stats, "host only")->gpu_calls, 0);
}

TEST_F(Profile, DeviceScopeGivesPlainScopesGpuTimeOnItsThread) {
  set_enabled(true);
  EXPECT_EQ(thread_device(), nullptr);
  {
    DeviceScope rank(Device::cuda(2));
    { Scope scope("layer"); }
    {
      DeviceScope host(Device::cpu());  // nested: a CPU device times nothing, then cuda:2 again
      { Scope scope("host"); }
    }
    ASSERT_NE(thread_device(), nullptr);
    EXPECT_EQ(*thread_device(), Device::cuda(2));
    std::thread other([] { Scope scope("other thread"); });  // another thread has no device
    other.join();
  }
  EXPECT_EQ(thread_device(), nullptr);
  { Scope scope("layer"); }
  ASSERT_EQ(fake_.timers.size(), 1u);
  EXPECT_EQ(fake_.timers[0].device, 2);
  const std::vector<Stats> stats = snapshot();
  EXPECT_EQ(find(stats, "layer")->calls, 2);
  EXPECT_EQ(find(stats, "layer")->gpu_calls, 1);
  EXPECT_EQ(find(stats, "host")->gpu_calls, 0);
  EXPECT_EQ(find(stats, "other thread")->gpu_calls, 0);
}

TEST_F(Profile, ResetDropsRowsAndReleasesPendingTimers) {
  set_enabled(true);
  { Scope scope("step", Device::cuda(0)); }
  reset();
  EXPECT_TRUE(fake_.timers[0].released);
  EXPECT_TRUE(snapshot().empty());
}

TEST_F(Profile, FormatTableShowsEveryRowAndDashesWithoutGpuTime) {
  set_enabled(true);
  { Scope scope("forward", Device::cuda(0)); }
  { Scope scope("data loading"); }
  const std::string text = format_table(snapshot());
  EXPECT_THAT(text, ::testing::HasSubstr("name"));
  EXPECT_THAT(text, ::testing::HasSubstr("gpu ms"));
  EXPECT_THAT(text, ::testing::ContainsRegex("forward +1 +[0-9.]+ +[0-9.]+ +[0-9.]+ +2\\.500 +2\\.500 +2\\.500"));
  EXPECT_THAT(text, ::testing::ContainsRegex("data loading +1 +[0-9.]+ +[0-9.]+ +[0-9.]+ +- +- +-"));
}

TEST_F(Profile, PartialTimerHooksAreRejected) {
  DeviceHooks h = fake_hooks();
  h.timer_release = nullptr;
  try {
    register_device_hooks(DeviceType::cuda, h);
    FAIL() << "accepted timer hooks without timer_release";
  } catch (const Error& e) {
    EXPECT_THAT(e.message(), ::testing::HasSubstr("the four timer hooks come together"));
  }
}

}  // namespace
}  // namespace cpf::profile
