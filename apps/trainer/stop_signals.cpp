#include "apps/trainer/stop_signals.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cstring>

#include "framework/core/error.h"

namespace cpf::trainer {
namespace {

std::atomic<int> g_received{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs a lock-free flag");
std::atomic<bool> g_installed{false};
struct sigaction g_previous_int, g_previous_term;
bool g_caught_int = false, g_caught_term = false;  // false: the signal was ignored at start and stays so

void say(const char* text) {
  // write(2) is async-signal-safe; a failed write to stderr has nowhere to be reported.
  const ssize_t ignored = ::write(STDERR_FILENO, text, std::strlen(text));
  (void)ignored;
}

void on_stop_signal(int signal) {
  int none = 0;
  if (g_received.compare_exchange_strong(none, signal)) {
    say(signal == SIGINT ? "\ncpformer: SIGINT received: stopping after this step and writing a checkpoint "
                           "(send it again to exit at once, without one)\n"
                         : "\ncpformer: SIGTERM received: stopping after this step and writing a checkpoint "
                           "(send it again to exit at once, without one)\n");
    return;
  }
  say(signal == SIGINT ? "cpformer: second signal (SIGINT): exiting at once, no checkpoint written\n"
                       : "cpformer: second signal (SIGTERM): exiting at once, no checkpoint written\n");
  ::_exit(stop_signal_exit_code(signal));
}

// A signal ignored when the process started stays ignored, as POSIX tools do: nohup, `trap '' TERM`
// and the background jobs of a non-interactive shell (SIGINT) asked for that.
bool catch_unless_ignored(int signal, const struct sigaction& action, struct sigaction* previous) {
  ::sigaction(signal, nullptr, previous);
  if (previous->sa_handler == SIG_IGN) return false;
  ::sigaction(signal, &action, previous);
  return true;
}

}  // namespace

StopSignalScope::StopSignalScope() {
  CPF_CHECK(!g_installed.exchange(true),
            "StopSignalScope: the stop-signal handlers are already installed "
            "(one training run per process at a time)");
  g_received.store(0);
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // blocking reads and waits resume; the loop checks the flag itself
  g_caught_int = catch_unless_ignored(SIGINT, action, &g_previous_int);
  g_caught_term = catch_unless_ignored(SIGTERM, action, &g_previous_term);
}

StopSignalScope::~StopSignalScope() {
  if (g_caught_int) ::sigaction(SIGINT, &g_previous_int, nullptr);
  if (g_caught_term) ::sigaction(SIGTERM, &g_previous_term, nullptr);
  g_installed.store(false);
}

namespace {

// Single quotes unless the word is plain (letters, digits and -_./=:,+).
std::string shell_quote(const std::string& word) {
  bool plain = !word.empty();
  for (char ch : word) {
    const bool word_char = std::isalnum(static_cast<unsigned char>(ch)) || std::strchr("-_./=:,+", ch) != nullptr;
    plain = plain && ch != 0 && word_char;
  }
  if (plain) return word;
  std::string quoted = "'";
  for (char ch : word) quoted += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return quoted + "'";
}

}  // namespace

std::string resume_command(const std::string& config_path, const std::vector<std::string>& overrides,
                           const std::optional<std::string>& gpus, ResumeMode mode) {
  std::string command = "cpformer train " + shell_quote(config_path);
  for (const std::string& o : overrides) command += " --set " + shell_quote(o);
  if (gpus) command += " --gpus " + shell_quote(*gpus);
  if (mode != ResumeMode::auto_resume) command += " --set run.resume=auto";
  return command;
}

int pending_stop_signal() { return g_received.load(); }

const char* stop_signal_name(int signal) {
  switch (signal) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    default: return "a signal";
  }
}

}  // namespace cpf::trainer
