#include "apps/run/run_folder.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "apps/report/checked_file.h"
#include "apps/run/checkpointing.h"
#include "framework/core/error.h"
#include "framework/io/checkpoint.h"
#include "models/memory_model.h"

namespace cpf::trainer {
namespace fs = std::filesystem;

namespace {

// The PID recorded in a lock file, or "unknown" when it holds none (its owner is between open and write).
std::string recorded_pid(int fd) {
  char buf[32] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  std::string text = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text.empty() ? "unknown" : text;
}

}  // namespace

RunFolderLock::RunFolderLock(const std::string& dir) : path_((fs::path(dir) / ".lock").string()) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  CPF_CHECK(!ec, "cannot create the run folder ", dir, ": ", ec.message());
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  CPF_CHECK(fd_ >= 0, "cannot open the run folder's lock file ", path_, ": ", std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    const std::string holder = recorded_pid(fd_);
    ::close(fd_);
    fd_ = -1;
    CPF_CHECK(err == EWOULDBLOCK, "cannot lock the run folder ", dir, " (", path_, "): ", std::strerror(err));
    CPF_FAIL("the run folder ", dir, " is in use by another cpformer train (PID ", holder, ", lock ", path_,
             "); wait for it to finish or stop it, or give this run another folder (run.out_dir or run.name)");
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  errno = 0;
  int err = ::ftruncate(fd_, 0) == 0 ? 0 : errno;
  if (err == 0 && ::pwrite(fd_, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    err = errno != 0 ? errno : EIO;
  }
  if (err != 0) {
    ::close(fd_);
    fd_ = -1;
    CPF_FAIL("cannot write the run folder's lock file ", path_, ": ", std::strerror(err));
  }
}

RunFolderLock::~RunFolderLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the flock
}

void check_checkpoints_writable(const TrainConfig& config) {
  const fs::path dir = checkpoints_dir(config);
  const std::string why =
      " (checked before step 1, so no training is lost; make it writable or set run.out_dir "
      "to a shorter, writable folder)";
  std::error_code ec;
  const bool existed = fs::exists(dir, ec);
  fs::create_directories(dir, ec);
  CPF_CHECK(!ec, "run folder: cannot create the checkpoint folder ", dir.string(), ": ", ec.message(), why);
  // The longest names a checkpoint uses: its temporary folder and the optimizer's file in it.
  const fs::path probe_dir = dir / ".tmp-step_99999999";
  const fs::path probe = probe_dir / "optimizer.safetensors.tmp";
  fs::create_directory(probe_dir, ec);
  CPF_CHECK(!ec, "run folder: cannot write checkpoints in ", dir.string(), ": creating ", probe_dir.string(), ": ",
            ec.message(), why);
  const bool written = static_cast<bool>(std::ofstream(probe) << "probe");
  fs::remove_all(probe_dir, ec);
  if (!existed) fs::remove(dir, ec);  // a run that writes no checkpoint leaves no folder for one
  CPF_CHECK(written, "run folder: cannot write checkpoints in ", dir.string(), ": writing ", probe.string(), " (",
            probe.string().size(), " characters) failed", why);
}

std::optional<std::string> checkpoint_space_warning(const TrainConfig& config, std::optional<uint64_t> available) {
  if (config.model.vocab_size < 1) return std::nullopt;  // not resolved yet: no size to compare
  const OptimizerOptions& opt = config.optimizer;
  const int moments = opt.type == OptimizerType::adamw ? 2 : (opt.momentum != 0 ? 1 : 0);
  const double one = static_cast<double>(models::count_parameters(config.model)) *
                     static_cast<double>(dtype_size(config.model.dtype)) * (1 + moments);  // bytes a checkpoint
  const int64_t every = config.run.checkpoint_every, keep = config.run.keep_checkpoints;
  const int64_t written = (every > 0 ? config.run.steps / every : 0) + 1;  // and one at the end
  const int64_t at_once = keep == 0 ? written : std::min(written, keep + 1);
  if (!available) {
    std::error_code ec;
    fs::path probe = run_dir(config);
    while (!probe.empty() && !fs::exists(probe, ec)) probe = probe.parent_path();  // the folder may not exist yet
    const fs::space_info space = fs::space(probe.empty() ? fs::path(".") : probe, ec);
    if (ec) return std::nullopt;
    available = space.available;
  }
  const double needed = one * static_cast<double>(at_once);
  if (static_cast<double>(*available) >= needed) return std::nullopt;
  const auto gb = [](double bytes) {
    std::ostringstream os;
    os.precision(3);
    os << bytes / 1e9 << " GB";
    return os.str();
  };
  return "checkpoints: each holds about " + gb(one) + " (weights and optimizer state), up to " +
         std::to_string(at_once) + " at once, but " + run_dir(config) + "'s file system has " +
         gb(static_cast<double>(*available)) +
         " free: the first checkpoint that does not fit stops the run there. Free space, lower "
         "run.keep_checkpoints or raise run.checkpoint_every, or set run.out_dir elsewhere";
}

void apply_start_mode(const TrainConfig& config) {
  const std::string dir = checkpoints_dir(config);
  if (config.run.resume == ResumeMode::never) {
    const auto existing = io::list_checkpoints(dir);
    CPF_CHECK(existing.empty(), "run.resume: never, but the run folder ", run_dir(config), " holds ", existing.size(),
              " checkpoint(s) (newest ", existing.empty() ? "" : existing.back(),
              "); a later run.resume: auto "
              "would continue them instead of this run. Set run.resume: replace to delete them and start over, "
              "run.resume: auto to continue, or give this run another folder (run.out_dir or run.name)");
  } else if (config.run.resume == ResumeMode::replace) {
    std::error_code ec;
    fs::remove_all(dir, ec);
    CPF_CHECK(!ec, "run.resume: replace: cannot delete ", dir, ": ", ec.message());
    // The records of the old run go with it (train.log and loss.svg too: they describe the old run).
    for (const char* name : {"metrics.jsonl", "train.log", "loss.svg"}) {
      const fs::path file = fs::path(run_dir(config)) / name;
      fs::remove(file, ec);
      CPF_CHECK(!ec, "run.resume: replace: cannot delete ", file.string(), ": ", ec.message());
    }
  }
}

}  // namespace cpf::trainer
