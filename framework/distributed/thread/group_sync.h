#pragma once
// Synchronisation shared by the ranks of one thread-backend group: the mutex and condition variable
// every wait of the group uses, the group's identity for messages, and the world's abort state.
//
// Every wait is bounded: it throws when the world is aborted (naming the rank that failed and its
// message) or when the group's timeout passes (naming the operation, the group and the ranks that
// did not arrive). A timeout aborts the world, because the ranks' operation sequences can no longer
// be matched; the other ranks then leave their waits at once with an error that quotes it.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace cpf::dist::thread {

class GroupSync;

// One per world: the first failure, and every group to wake when it happens.
class AbortState {
 public:
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  // Records the first failure (later ones are ignored) and wakes every waiting rank of every group.
  // global_rank < 0: no rank failed (the world is being torn down).
  void abort(int global_rank, const std::string& reason);
  // "rank 2 failed: <reason>" (just the reason when no rank failed); empty before any abort.
  std::string reason() const;
  void add_group(std::weak_ptr<GroupSync> group);

 private:
  std::atomic<bool> aborted_{false};
  mutable std::mutex mutex_;
  int failed_rank_ = -1;
  std::string reason_;
  std::vector<std::weak_ptr<GroupSync>> groups_;
};

class GroupSync {
 public:
  GroupSync(std::string name, std::vector<int> global_ranks, std::chrono::milliseconds timeout,
            std::shared_ptr<AbortState> abort);

  const std::string& name() const { return name_; }
  const std::vector<int>& global_ranks() const { return global_ranks_; }
  int size() const { return static_cast<int>(global_ranks_.size()); }
  std::chrono::milliseconds timeout() const { return timeout_; }
  const std::shared_ptr<AbortState>& abort_ptr() const { return abort_; }
  // "group 'cp' (global ranks [4,5,6,7])"
  std::string describe() const;
  // "ranks [1,3] (global [5,7])" for a list of group ranks.
  std::string describe_ranks(const std::vector<int>& ranks) const;

  std::mutex& mutex() { return mutex_; }
  void notify_all() { cv_.notify_all(); }
  void wake();  // lock + notify_all, for the abort state

  // Waits (lock held) until ready() is true. Throws when the world is aborted, or when the timeout
  // passes: then the message is `what` + " timed out after <t> ms " + waiting_for(), the world is
  // aborted with it on behalf of `global_rank`, and the error is thrown.
  void wait(std::unique_lock<std::mutex>& lock, const std::string& what, int global_rank,
            const std::function<bool()>& ready, const std::function<std::string()>& waiting_for);

 private:
  const std::string name_;
  const std::vector<int> global_ranks_;
  const std::chrono::milliseconds timeout_;
  const std::shared_ptr<AbortState> abort_;
  std::mutex mutex_;
  std::condition_variable cv_;
};

}  // namespace cpf::dist::thread
