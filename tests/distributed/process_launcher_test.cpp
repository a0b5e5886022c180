// spawn_local_processes with /bin/sh children: environment, prefixed output, and a failing rank
// that takes the others down with a message naming it (never a hang).
#include "framework/distributed/process_launcher.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "support/test_utils.h"

namespace cpf::testing {
namespace {

using namespace std::chrono_literals;

struct Captured {
  std::mutex mutex;
  std::vector<std::pair<int, std::string>> lines;
  std::function<void(int, std::string_view)> sink() {
    return [this](int rank, std::string_view line) {
      std::lock_guard lock(mutex);
      lines.emplace_back(rank, std::string(line));
    };
  }
  bool has(int rank, const std::string& text) {
    std::lock_guard lock(mutex);
    for (const auto& [r, l] : lines) {
      if (r == rank && l == text) return true;
    }
    return false;
  }
  std::string all() {
    std::lock_guard lock(mutex);
    std::string s;
    for (const auto& [r, l] : lines) s += "[" + std::to_string(r) + "] " + l + "\n";
    return s;
  }
};

dist::SpawnResult sh(int n, const std::string& script, Captured& out, dist::SpawnOptions options = {}) {
  options.output = out.sink();
  return dist::spawn_local_processes(n, {"/bin/sh", "-c", script}, options);
}

TEST(ProcessLauncher, EveryRankGetsItsEnvironment) {
  Captured out;
  const auto r = sh(3,
                    "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $NCCL_NVLS_ENABLE $EXTRA\"; "
                    "echo port=$MASTER_PORT",
                    out, {.extra_env = {{"EXTRA", "x"}}});
  EXPECT_EQ(r.exit_code, 0) << r.message;
  EXPECT_EQ(r.failed_rank, -1);
  EXPECT_EQ(r.message, "");
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_TRUE(out.has(rank, std::to_string(rank) + " 3 " + std::to_string(rank) + " 3 127.0.0.1 0 x")) << out.all();
  }
  // One port for all ranks.
  std::lock_guard lock(out.mutex);
  std::string port;
  for (const auto& [rank, line] : out.lines) {
    if (line.rfind("port=", 0) != 0) continue;
    if (port.empty()) port = line;
    EXPECT_EQ(line, port);
    EXPECT_NE(line, "port=");
  }
}

// Every launch gets its own rendezvous secret, the same for all of its ranks.
TEST(ProcessLauncher, EachLaunchGivesItsRanksOneFreshToken) {
  auto tokens = [] {
    Captured out;
    const auto r = sh(2, "echo token=$CPF_RENDEZVOUS_TOKEN", out);
    EXPECT_EQ(r.exit_code, 0) << r.message;
    std::lock_guard lock(out.mutex);
    std::vector<std::string> seen;
    for (const auto& [rank, line] : out.lines) seen.push_back(line);
    return seen;
  };
  const std::vector<std::string> first = tokens(), second = tokens();
  ASSERT_EQ(first.size(), 2u);
  ASSERT_EQ(second.size(), 2u);
  EXPECT_EQ(first[0], first[1]);
  EXPECT_EQ(first[0].size(), std::string("token=").size() + 32) << first[0];
  EXPECT_NE(first[0], second[0]);
}

TEST(ProcessLauncher, ExtraEnvironmentOverridesAndStderrIsForwarded) {
  Captured out;
  const auto r = sh(2, "echo to-stderr-$NCCL_NVLS_ENABLE 1>&2; printf 'no newline at the end'", out,
                    {.extra_env = {{"NCCL_NVLS_ENABLE", "0"}, {"MASTER_ADDR", "10.1.1.1"}}});
  EXPECT_EQ(r.exit_code, 0) << r.message;
  EXPECT_TRUE(out.has(0, "to-stderr-0")) << out.all();
  EXPECT_TRUE(out.has(1, "no newline at the end")) << out.all();
}

TEST(ProcessLauncher, AFailingRankTerminatesTheOthersAndIsNamed) {
  Captured out;
  const auto start = std::chrono::steady_clock::now();
  // Rank 1 exits 3 at once; the others would sleep for a minute.
  const auto r = sh(3, "if [ \"$RANK\" = 1 ]; then echo bye; exit 3; fi; sleep 60", out, {.grace = 2s});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(r.failed_rank, 1);
  EXPECT_NE(r.message.find("rank 1 exited with status 3"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("terminated the other ranks [0,2]"), std::string::npos) << r.message;
  EXPECT_TRUE(out.has(1, "bye")) << out.all();
  EXPECT_LT(seconds, 20.0) << "the survivors must be terminated, not waited for";
}

TEST(ProcessLauncher, AFailingSurvivorIsNamedBesideTheFirstDeath) {
  Captured out;
  // Rank 1 fails first; rank 0 ignores SIGTERM and fails by itself a little later (a survivor that
  // learnt of the death and exits with its own error). Rank 1 waits 0.2 s so that rank 0's shell has
  // set its trap: a SIGTERM before that ended rank 0 by our signal (about 1 run in 8 on a busy machine).
  const auto r =
      sh(2, "trap '' TERM; if [ \"$RANK\" = 1 ]; then sleep 0.2; exit 3; fi; sleep 0.5; exit 4", out, {.grace = 5s});
  EXPECT_EQ(r.failed_rank, 1) << r.message;
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_NE(r.message.find("rank 1 exited with status 3 (also: rank 0 exited with status 4)"), std::string::npos)
      << r.message;
}

TEST(ProcessLauncher, SurvivorsIgnoringSigtermAreKilledAfterTheGrace) {
  Captured out;
  const auto start = std::chrono::steady_clock::now();
  // Rank 0 waits until rank 1 surely ignores SIGTERM, then dies by SIGKILL.
  const auto r =
      sh(2, "trap '' TERM; if [ \"$RANK\" = 0 ]; then sleep 0.3; kill -9 $$; fi; sleep 60", out, {.grace = 500ms});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.failed_rank, 0) << r.message;
  EXPECT_EQ(r.exit_code, 128 + 9);
  EXPECT_NE(r.message.find("rank 0 was killed by signal 9"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("terminated the other ranks [1]"), std::string::npos) << r.message;
  EXPECT_GE(seconds, 0.3 + 0.5) << "rank 1 ignores SIGTERM: only the SIGKILL after the grace ends it";
  EXPECT_LT(seconds, 20.0);
}

TEST(ProcessLauncher, RejectsBadArgumentsAndReportsExecFailures) {
  Captured out;
  EXPECT_CPF_ERROR(dist::spawn_local_processes(0, {"/bin/true"}), "need at least one process");
  EXPECT_CPF_ERROR(dist::spawn_local_processes(2, {}), "argv is empty");
  const auto r = dist::spawn_local_processes(2, {"/nonexistent/program"}, {.output = out.sink()});
  EXPECT_EQ(r.exit_code, 127);
  EXPECT_NE(r.message.find("exited with status 127"), std::string::npos) << r.message;
}

}  // namespace
}  // namespace cpf::testing

namespace cpf::testing {
namespace {

// Rank 1 dies; rank 0, seeing it dead (its /proc state turns Z here; the rendezvous tells it in real
// runs), exits 4 within the same poll round of the launcher: rank 1 must still be the one blamed.
TEST(ProcessLauncher, TheFirstToDieIsBlamedWhenASurvivorFollowsAtOnce) {
  for (int attempt = 0; attempt < 5; ++attempt) {
    char dir_template[] = "/tmp/cpf_spawn_XXXXXX";
    const char* dir = ::mkdtemp(dir_template);
    ASSERT_NE(dir, nullptr);
    Captured out;
    const auto r = sh(2,
                      "if [ \"$RANK\" = 1 ]; then echo $$ > \"$MARK/tmp\"; mv \"$MARK/tmp\" \"$MARK/pid\"; exit 3; fi; "
                      "while [ ! -f \"$MARK/pid\" ]; do :; done; p=$(cat \"$MARK/pid\"); "
                      "while [ -e /proc/$p ] && [ \"$(cut -d' ' -f3 /proc/$p/stat)\" != Z ]; do :; done; exit 4",
                      out, {.extra_env = {{"MARK", dir}}});
    EXPECT_EQ(r.failed_rank, 1) << "attempt " << attempt << ": " << r.message;
    EXPECT_EQ(r.exit_code, 3) << r.message;
    EXPECT_NE(r.message.find("rank 1 exited with status 3"), std::string::npos) << r.message;
    std::remove((std::string(dir) + "/pid").c_str());
    ::rmdir(dir);
  }
}

}  // namespace
}  // namespace cpf::testing
