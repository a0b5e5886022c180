#pragma once
// Runs the real cpformer binary as a child process, for what an in-process run cannot show: signals,
// a second trainer in another process, exit codes, a stdout that cannot be written. Its stdout and
// stderr go to files the test reads while it runs.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tests/apps/cli_support.h"

namespace cpf::trainer::testing {

// $CPF_CPFORMER_BIN, else `cpformer` as built beside these tests (tests/CMakeLists.txt defines the path).
inline std::string cpformer_binary() {
  if (const char* env = std::getenv("CPF_CPFORMER_BIN"); env && *env) return env;
#ifdef CPF_CPFORMER_BIN
  return CPF_CPFORMER_BIN;
#else
  return "";
#endif
}

class ChildProcess {
 public:
  // Starts `cpformer args...` with stdout to `stdout_path` and stderr to `stderr_path`; `ignored_signal`
  // (when not 0) is ignored from the start, as nohup or `trap '' TERM` would leave it.
  ChildProcess(const std::vector<std::string>& args, const std::filesystem::path& stdout_path,
               const std::filesystem::path& stderr_path, int ignored_signal = 0)
      : stdout_path_(stdout_path), stderr_path_(stderr_path) {
    const std::string bin = cpformer_binary();
    std::vector<std::string> argv = {bin};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> cargv;
    for (std::string& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    const std::string out = stdout_path.string(), err = stderr_path.string();
    pid_ = ::fork();
    if (pid_ == 0) {
      // Only async-signal-safe calls between fork and exec.
      const int out_fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int err_fd = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (out_fd < 0 || err_fd < 0 || ::dup2(out_fd, STDOUT_FILENO) < 0 || ::dup2(err_fd, STDERR_FILENO) < 0) {
        ::_exit(127);
      }
      if (ignored_signal != 0) ::signal(ignored_signal, SIG_IGN);
      ::execv(cargv[0], cargv.data());
      ::_exit(127);
    }
  }
  ~ChildProcess() {
    if (pid_ > 0 && !status_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  std::string out() const { return read_file(stdout_path_); }
  std::string err() const { return read_file(stderr_path_); }

  // Waits until stdout (or stderr) contains `text` `times` times; false after `timeout` or if the child ended.
  bool wait_for_output(const std::string& text, int times = 1, bool on_stderr = false,
                       std::chrono::seconds timeout = std::chrono::seconds(120)) {
    auto seen = [&] {
      const std::string s = on_stderr ? err() : out();
      int found = 0;
      for (size_t at = s.find(text); at != std::string::npos; at = s.find(text, at + 1)) ++found;
      return found >= times;
    };
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (seen()) return true;
      int status = 0;
      if (!status_ && ::waitpid(pid_, &status, WNOHANG) == pid_) status_ = status;
      if (status_) return seen();  // it ended: what it wrote is all there is
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return false;
  }

  // The exit code (128 + signal when killed by one); SIGKILLs the child and fails the test after `timeout`.
  int wait(std::chrono::seconds timeout = std::chrono::seconds(120)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!status_) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        status_ = status;
        break;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        status_ = status;
        ADD_FAILURE() << "cpformer did not exit within " << timeout.count() << " s; stdout:\n" << out();
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return WIFEXITED(*status_) ? WEXITSTATUS(*status_) : 128 + WTERMSIG(*status_);
  }

 private:
  pid_t pid_ = -1;
  std::optional<int> status_;
  std::filesystem::path stdout_path_, stderr_path_;
};

}  // namespace cpf::trainer::testing
