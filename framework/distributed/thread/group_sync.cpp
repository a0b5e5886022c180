#include "framework/distributed/thread/group_sync.h"

#include "framework/core/error.h"

namespace cpf::dist::thread {

void AbortState::abort(int global_rank, const std::string& reason) {
  std::vector<std::weak_ptr<GroupSync>> groups;
  {
    std::lock_guard lock(mutex_);
    if (aborted_.load(std::memory_order_relaxed)) return;
    failed_rank_ = global_rank;
    reason_ = reason;
    aborted_.store(true, std::memory_order_release);
    groups = groups_;
  }
  // The flag is set before each group's mutex is taken, so a rank that checked it under that mutex
  // and went to sleep is woken by this notify: no wake-up is lost.
  for (const auto& weak : groups) {
    if (auto group = weak.lock()) group->wake();
  }
}

std::string AbortState::reason() const {
  std::lock_guard lock(mutex_);
  if (!aborted_.load(std::memory_order_relaxed)) return "";
  if (failed_rank_ < 0) return reason_;
  return str_cat("rank ", failed_rank_, " failed: ", reason_);
}

void AbortState::add_group(std::weak_ptr<GroupSync> group) {
  std::lock_guard lock(mutex_);
  // Drop groups that no longer exist so long runs that create many groups do not grow the list.
  std::erase_if(groups_, [](const std::weak_ptr<GroupSync>& g) { return g.expired(); });
  groups_.push_back(std::move(group));
}

GroupSync::GroupSync(std::string name, std::vector<int> global_ranks, std::chrono::milliseconds timeout,
                     std::shared_ptr<AbortState> abort)
    : name_(std::move(name)), global_ranks_(std::move(global_ranks)), timeout_(timeout), abort_(std::move(abort)) {}

std::string GroupSync::describe() const { return str_cat("group '", name_, "' (global ranks ", global_ranks_, ")"); }

std::string GroupSync::describe_ranks(const std::vector<int>& ranks) const {
  std::vector<int> global;
  for (int r : ranks) global.push_back(global_ranks_[static_cast<size_t>(r)]);
  if (global == ranks) return str_cat("ranks ", ranks);
  return str_cat("ranks ", ranks, " (global ", global, ")");
}

void GroupSync::wake() {
  std::lock_guard lock(mutex_);
  cv_.notify_all();
}

void GroupSync::wait(std::unique_lock<std::mutex>& lock, const std::string& what, int global_rank,
                     const std::function<bool()>& ready, const std::function<std::string()>& waiting_for) {
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  while (true) {
    if (abort_->aborted()) {
      const std::string reason = abort_->reason();
      lock.unlock();
      CPF_FAIL(what, " aborted: ", reason);
    }
    if (ready()) return;
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && !ready() && !abort_->aborted()) {
      const std::string message = str_cat(what, " timed out after ", timeout_.count(), " ms ", waiting_for());
      // abort() takes every group's mutex, this one included.
      lock.unlock();
      abort_->abort(global_rank, message);
      CPF_FAIL(message);
    }
  }
}

}  // namespace cpf::dist::thread
