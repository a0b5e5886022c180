#pragma once
// The thread backend: N ranks as threads of one process.
//
//   auto world = dist::thread::ThreadWorld::create(4, {.timeout = std::chrono::seconds(10)});
//   // on rank r's thread:
//   dist::ProcessGroupPtr pg = world->group(r);
//   Tensor total = pg->all_reduce(x);
//
// Usually dist::launch (launcher.h) does this. Each rank has a progress thread (RankStream) that
// runs the rank's operations in issue order, so asynchronous operations really overlap with the
// rank's compute. The data moves once, between the ranks' own tensors (no staging buffers), except
// that a send whose receiver is late is snapshotted (mailbox.h). Tensors on other devices are
// staged through host memory.
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "framework/distributed/process_group.h"
#include "framework/distributed/thread/group_state.h"
#include "framework/distributed/thread/rank_stream.h"

namespace cpf::dist::thread {

struct OpContext;

struct ThreadWorldOptions {
  // Bound of every wait; a rank that waits longer throws and aborts the world.
  std::chrono::milliseconds timeout = kDefaultTimeout;
  // OpenMP threads of each progress thread's copies and reductions (0: the OpenMP default).
  int omp_threads_per_rank = 0;
  std::string name = "world";
};

class ThreadWorld : public std::enable_shared_from_this<ThreadWorld> {
 public:
  static std::shared_ptr<ThreadWorld> create(int size, ThreadWorldOptions options = {});
  // Aborts what is still pending, then joins the progress threads.
  ~ThreadWorld();
  ThreadWorld(const ThreadWorld&) = delete;
  ThreadWorld& operator=(const ThreadWorld&) = delete;

  int size() const { return static_cast<int>(streams_.size()); }
  const ThreadWorldOptions& options() const { return options_; }
  // Rank `rank`'s handle on the world group; one per rank (a handle counts its rank's steps).
  ProcessGroupPtr group(int rank);

  // Fails every waiting and future operation of every group of this world (first call wins).
  void abort(int global_rank, const std::string& reason);
  bool aborted() const { return abort_->aborted(); }
  std::string abort_reason() const { return abort_->reason(); }

  RankStream& stream(int global_rank) { return *streams_[static_cast<size_t>(global_rank)]; }

 private:
  ThreadWorld(int size, ThreadWorldOptions options);

  const ThreadWorldOptions options_;
  std::shared_ptr<AbortState> abort_;
  std::shared_ptr<GroupState> world_state_;
  std::vector<std::unique_ptr<RankStream>> streams_;
  std::mutex mutex_;
  std::vector<bool> handed_out_;
};

class ThreadProcessGroup final : public ProcessGroup {
 public:
  ThreadProcessGroup(std::shared_ptr<ThreadWorld> world, std::shared_ptr<GroupState> state, int rank);

  int rank() const override { return rank_; }
  int size() const override { return state_->sync->size(); }
  const std::string& name() const override { return state_->sync->name(); }
  const std::vector<int>& global_ranks() const override { return state_->sync->global_ranks(); }
  std::string backend() const override { return "thread"; }
  std::chrono::milliseconds timeout() const override { return state_->sync->timeout(); }
  void abort(const std::string& reason) override;

 protected:
  WorkPtr do_all_reduce(const Tensor& input, ReduceOp op, const Tensor& out) override;
  WorkPtr do_broadcast(const Tensor& input, int root, const Tensor& out) override;
  WorkPtr do_all_gather(const Tensor& input, int64_t dim, const Tensor& out) override;
  WorkPtr do_reduce_scatter(const Tensor& input, int64_t dim, ReduceOp op, const Tensor& out, int64_t out_size,
                            const std::vector<int64_t>& splits) override;
  WorkPtr do_all_to_all(const Tensor& input, int64_t split_dim, int64_t concat_dim, const Tensor& out) override;
  WorkPtr do_batch_p2p(const std::vector<P2POp>& ops) override;
  WorkPtr do_barrier() override;
  std::shared_ptr<ProcessGroup> do_new_group(const std::vector<int>& ranks, const std::string& name) override;
  std::shared_ptr<ProcessGroup> do_split(const std::vector<std::vector<int>>& partition,
                                         const std::string& name) override;

 private:
  // Queues body(OpContext) on this rank's progress thread; collectives take the next step number.
  template <class Body>
  WorkPtr submit(const char* op, bool collective, Body body);

  std::shared_ptr<ThreadWorld> world_;
  std::shared_ptr<GroupState> state_;
  const int rank_;
  uint64_t next_seq_ = 0;  // touched only by the thread issuing this rank's operations
};

}  // namespace cpf::dist::thread
