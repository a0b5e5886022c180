#include "framework/distributed/process_launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>

#include "framework/core/error.h"
#include "framework/distributed/rendezvous_tcp.h"

extern char** environ;

namespace cpf::dist {
namespace {

using Clock = std::chrono::steady_clock;

struct Child {
  int rank = 0;
  pid_t pid = -1;
  int out_fd = -1;      // read end of the child's stdout+stderr
  std::string pending;  // output not yet ended by a newline
  bool exited = false;
  int status = 0;  // waitpid status
  bool terminated_by_us = false;
  // When it ended (steady clock, ns), seen by a thread blocked in waitid(WNOWAIT) on it: tells which
  // rank died first when a survivor, told of the death, exits within the same poll round.
  std::shared_ptr<std::atomic<int64_t>> ended_ns = std::make_shared<std::atomic<int64_t>>(INT64_MAX);
  // When its output reached end of file. An exiting process closes its descriptors in order, stdout and
  // stderr first, before its sockets (which is how a survivor learns of the death) and long before a
  // GPU process becomes a zombie (the driver's teardown can take a second), so this orders deaths
  // where ended_ns cannot.
  int64_t output_closed_ns = INT64_MAX;
};

std::string describe_status(int status) {
  if (WIFEXITED(status)) return str_cat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = ::strsignal(sig);
    return str_cat("was killed by signal ", sig, " (", name ? name : "?", ")");
  }
  return str_cat("ended with wait status ", status);
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// The environment of rank `rank`: this process's, with the launcher's variables set over it.
std::vector<std::string> child_environment(const std::map<std::string, std::string>& set) {
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    if (!set.count(name)) env.push_back(entry);
  }
  for (const auto& [name, value] : set) env.push_back(name + "=" + value);
  return env;
}

pid_t start_child(const std::vector<std::string>& argv, const std::vector<std::string>& env, int out_write,
                  int out_read) {
  // Everything the child needs is built before fork (only async-signal-safe calls after it).
  std::vector<char*> args, envp;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid != 0) {
    // Also here, so the group exists before the child runs: a kill(-pid) right after fork reaches it.
    if (pid > 0) ::setpgid(pid, pid);
    return pid;
  }
  // Child.
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(127);  // the parent died before prctl
  ::dup2(out_write, STDOUT_FILENO);
  ::dup2(out_write, STDERR_FILENO);
  ::close(out_write);
  ::close(out_read);
  ::execvpe(args[0], args.data(), envp.data());
  const char* msg = "spawn_local_processes: exec failed\n";
  (void)!::write(STDERR_FILENO, msg, std::strlen(msg));
  ::_exit(127);
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

// Records the first time a child was seen ended.
void mark_ended(std::atomic<int64_t>& ended) {
  int64_t unset = INT64_MAX;
  ended.compare_exchange_strong(unset, now_ns());
}

void default_output(int rank, std::string_view line) {
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  std::cout << "[rank " << rank << "] " << line << "\n" << std::flush;
}

using OutputFn = std::function<void(int rank, std::string_view line)>;

// Hands every complete line of c's pending output to `output`; `all` also hands the unfinished rest.
void flush_lines(const OutputFn& output, Child& c, bool all) {
  size_t end;
  while ((end = c.pending.find('\n')) != std::string::npos) {
    output(c.rank, std::string_view(c.pending).substr(0, end));
    c.pending.erase(0, end + 1);
  }
  if (all && !c.pending.empty()) {
    output(c.rank, c.pending);
    c.pending.clear();
  }
}

bool failed(int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); }

// Start: one child per rank, each with its rank's variables and its output on a pipe. A failed fork
// kills and reaps the children already started before throwing.
std::vector<Child> start_children(int n, const std::vector<std::string>& argv, const SpawnOptions& options) {
  const int port = options.master_port > 0 ? options.master_port : find_free_port();
  // One secret per launch: only these children can join rank 0's rendezvous.
  const std::string token = generate_rendezvous_token();
  std::vector<Child> children(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    std::map<std::string, std::string> vars = {
        {"RANK", std::to_string(r)},       {"WORLD_SIZE", std::to_string(n)},
        {"LOCAL_RANK", std::to_string(r)}, {"LOCAL_WORLD_SIZE", std::to_string(n)},
        {"MASTER_ADDR", "127.0.0.1"},      {"MASTER_PORT", std::to_string(port)},
        {"NCCL_NVLS_ENABLE", "0"},         {"CPF_RENDEZVOUS_TOKEN", token},
    };
    for (const auto& [k, v] : options.extra_env) vars[k] = v;
    int pipe_fds[2];
    CPF_CHECK(::pipe2(pipe_fds, O_CLOEXEC) == 0, "spawn_local_processes: pipe2 failed: ", std::strerror(errno));
    Child& c = children[static_cast<size_t>(r)];
    c.rank = r;
    c.pid = start_child(argv, child_environment(vars), pipe_fds[1], pipe_fds[0]);
    ::close(pipe_fds[1]);
    c.out_fd = pipe_fds[0];
    if (c.pid < 0) {
      const int err = errno;
      for (Child& other : children) {
        if (other.pid > 0) ::kill(-other.pid, SIGKILL);
      }
      for (Child& other : children) {
        if (other.pid > 0) ::waitpid(other.pid, nullptr, 0);
        if (other.out_fd >= 0) ::close(other.out_fd);
      }
      CPF_FAIL("spawn_local_processes: fork failed for rank ", r, ": ", std::strerror(err));
    }
  }
  return children;
}

// One launch after the start: the children, and when the survivors of a failure were signalled.
struct Launch {
  std::vector<Child>& children;
  const SpawnOptions& options;
  OutputFn output;
  bool failure_seen = false;
  int64_t kill_ns = INT64_MAX;               // when the survivors were sent SIGTERM
  std::optional<Clock::time_point> kill_at;  // set once the survivors were sent SIGTERM

  // Pump output: waits up to 50 ms for output and forwards the complete lines; notes when a pipe closed.
  void pump_output() {
    std::vector<pollfd> polls;
    std::vector<Child*> owners;
    for (Child& c : children) {
      if (c.out_fd >= 0) {
        polls.push_back({c.out_fd, POLLIN, 0});
        owners.push_back(&c);
      }
    }
    if (!polls.empty()) ::poll(polls.data(), polls.size(), 50);
    const int64_t round_ns = now_ns();  // one stamp per round: no rank is earlier for its place in the loop
    for (size_t i = 0; i < polls.size(); ++i) {
      if (!polls[i].revents) continue;
      Child& c = *owners[i];
      // Hang-up is reported while output may still be buffered: the close time is now, not when the
      // buffered lines have been drained.
      if ((polls[i].revents & POLLHUP) && c.output_closed_ns == INT64_MAX) c.output_closed_ns = round_ns;
      char chunk[4096];
      const ssize_t got = ::read(c.out_fd, chunk, sizeof chunk);
      if (got > 0) {
        c.pending.append(chunk, static_cast<size_t>(got));
        flush_lines(output, c, false);
      } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
        c.output_closed_ns = std::min(c.output_closed_ns, round_ns);
        flush_lines(output, c, true);
        ::close(c.out_fd);
        c.out_fd = -1;
      }
    }
    if (polls.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }

  // The first failure sends SIGTERM to every survivor and arms the SIGKILL deadline.
  void terminate_survivors() {
    failure_seen = true;
    kill_ns = now_ns();
    for (Child& other : children) {
      if (!other.exited) {
        ::kill(-other.pid, SIGTERM);
        ::kill(other.pid, SIGTERM);  // in case it left its group
        other.terminated_by_us = true;
      }
    }
    kill_at = Clock::now() + options.grace;
  }

  // Reap: collects the children that ended; true once all have.
  bool reap() {
    bool all_exited = true;
    for (Child& c : children) {
      if (c.exited) continue;
      int status = 0;
      const pid_t got = ::waitpid(c.pid, &status, WNOHANG);
      if (got == c.pid) {
        c.exited = true;
        c.status = status;
        mark_ended(*c.ended_ns);
        if (failed(status) && !failure_seen) terminate_survivors();
      } else {
        all_exited = false;
      }
    }
    return all_exited;
  }

  // Survivors still running past the grace period get SIGKILL, once.
  void kill_after_grace() {
    if (!kill_at || Clock::now() < *kill_at) return;
    for (Child& c : children) {
      if (!c.exited) {
        ::kill(-c.pid, SIGKILL);
        ::kill(c.pid, SIGKILL);
      }
    }
    kill_at = Clock::now() + std::chrono::hours(1);  // once
  }

  // After the last exit the pipes may still hold output (grandchildren can keep them open: do not wait
  // for those).
  void drain_output() {
    for (Child& c : children) {
      if (c.out_fd < 0) continue;
      char chunk[4096];
      ::fcntl(c.out_fd, F_SETFL, ::fcntl(c.out_fd, F_GETFL) | O_NONBLOCK);
      ssize_t got;
      while ((got = ::read(c.out_fd, chunk, sizeof chunk)) > 0) c.pending.append(chunk, static_cast<size_t>(got));
      flush_lines(output, c, true);
      ::close(c.out_fd);
    }
  }

  // Blame: of the failed ranks not ended by our signals, the one that ended first (its output closed,
  // or it exited, whichever was seen earlier).
  std::tuple<bool, int64_t, int> blame_key(const Child& c) const {
    const int64_t ended = std::min(c.output_closed_ns, c.ended_ns->load());
    const bool ours = c.terminated_by_us && ended > kill_ns && WIFSIGNALED(c.status) &&
                      (WTERMSIG(c.status) == SIGTERM || WTERMSIG(c.status) == SIGKILL);
    return std::make_tuple(ours, ended, c.rank);
  }

  SpawnResult verdict() const {
    SpawnResult result;
    const Child* culprit = nullptr;
    for (const Child& c : children) {
      if (failed(c.status) && (!culprit || blame_key(c) < blame_key(*culprit))) culprit = &c;
    }
    if (!culprit) return result;
    result.failed_rank = culprit->rank;
    result.exit_code = exit_code_of(culprit->status);
    result.message = str_cat("rank ", culprit->rank, " ", describe_status(culprit->status));
    // Other ranks that failed on their own (not by our signals) are named too: the order of two
    // nearly simultaneous deaths is a heuristic (a GPU process's teardown can take a second).
    std::vector<std::string> also;
    for (const Child& c : children) {
      if (failed(c.status) && &c != culprit && !std::get<0>(blame_key(c))) {
        also.push_back(str_cat("rank ", c.rank, " ", describe_status(c.status)));
      }
    }
    for (size_t i = 0; i < also.size(); ++i) result.message += (i == 0 ? " (also: " : ", ") + also[i];
    if (!also.empty()) result.message += ")";
    std::vector<int> terminated;
    for (const Child& c : children) {
      if (c.terminated_by_us && &c != culprit) terminated.push_back(c.rank);
    }
    if (!terminated.empty()) result.message += str_cat("; terminated the other ranks ", terminated);
    return result;
  }
};

}  // namespace

SpawnResult spawn_local_processes(int n, const std::vector<std::string>& argv, const SpawnOptions& options) {
  CPF_CHECK(n >= 1, "spawn_local_processes: need at least one process, got ", n);
  CPF_CHECK(!argv.empty() && !argv[0].empty(), "spawn_local_processes: argv is empty; give the program to run");
  std::vector<Child> children = start_children(n, argv, options);
  Launch launch{children, options, options.output ? options.output : OutputFn(default_output)};
  std::vector<std::thread> exit_watchers;
  for (const Child& c : children) {
    exit_watchers.emplace_back([pid = c.pid, ended = c.ended_ns] {
      siginfo_t info{};
      // ECHILD: the reap step reaped it first and recorded its own time.
      if (::waitid(P_PID, pid, &info, WEXITED | WNOWAIT) == 0) mark_ended(*ended);
    });
  }
  while (true) {
    launch.pump_output();  // output first, so a child's last words appear before the verdict
    if (launch.reap()) break;
    launch.kill_after_grace();
  }
  launch.drain_output();
  for (std::thread& t : exit_watchers) t.join();  // every child was reaped: each waitid has returned
  return launch.verdict();
}

}  // namespace cpf::dist
