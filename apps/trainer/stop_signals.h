#pragma once
// SIGINT (Ctrl-C) and SIGTERM (SLURM preemption, `docker stop`, kill) while `cpformer train` runs.
//
// The first signal only sets a flag (all an async-signal-safe handler may do) and says so on stderr;
// the training loop reads it between steps, the ranks agree on it (an all-reduce, so no rank waits in
// a collective the others left), every rank takes part in a final checkpoint, and the run ends with
// exit code 128 + signal (130 for SIGINT, 143 for SIGTERM). A second signal ends the process at once
// with that code and no checkpoint (the checkpoint being written is atomic, so nothing is torn).
// A signal that was ignored when the process started (nohup, `trap '' TERM`, SIGINT in the background
// jobs of a non-interactive shell) stays ignored.
#include <optional>
#include <string>
#include <vector>

#include "apps/config/config.h"

namespace cpf::trainer {

// Installs the handlers for its lifetime and restores the previous ones after. Clears any flag left
// by an earlier run of this process. One scope at a time (train() holds it).
class StopSignalScope {
 public:
  StopSignalScope();
  ~StopSignalScope();
  StopSignalScope(const StopSignalScope&) = delete;
  StopSignalScope& operator=(const StopSignalScope&) = delete;
};

// The signal received since the scope began (SIGINT or SIGTERM), or 0.
int pending_stop_signal();

// "SIGINT", "SIGTERM", or "signal N".
const char* stop_signal_name(int signal);

// The exit code of a run stopped by `signal`: 128 + signal, as a shell reports it.
inline int stop_signal_exit_code(int signal) { return 128 + signal; }

// The command that continues a stopped run: the same `cpformer train` arguments (shell-quoted), plus
// --set run.resume=auto when the config says never or replace (either would refuse or delete the
// checkpoint just written).
std::string resume_command(const std::string& config_path, const std::vector<std::string>& overrides,
                           const std::optional<std::string>& gpus, ResumeMode mode);

}  // namespace cpf::trainer
