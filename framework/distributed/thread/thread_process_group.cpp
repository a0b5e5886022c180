#include "framework/distributed/thread/thread_process_group.h"

#include <algorithm>

#include "framework/distributed/thread/collectives.h"

namespace cpf::dist::thread {

std::shared_ptr<ThreadWorld> ThreadWorld::create(int size, ThreadWorldOptions options) {
  CPF_CHECK(size >= 1, "ThreadWorld: the world needs at least one rank, got ", size);
  CPF_CHECK(options.timeout.count() > 0, "ThreadWorld: the timeout must be positive, got ", options.timeout.count(),
            " ms");
  return std::shared_ptr<ThreadWorld>(new ThreadWorld(size, std::move(options)));
}

ThreadWorld::ThreadWorld(int size, ThreadWorldOptions options)
    : options_(std::move(options)), abort_(std::make_shared<AbortState>()), handed_out_(static_cast<size_t>(size)) {
  std::vector<int> ranks(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    ranks[static_cast<size_t>(r)] = r;
    streams_.push_back(std::make_unique<RankStream>(r, options_.omp_threads_per_rank));
  }
  world_state_ = GroupState::create(options_.name, std::move(ranks), options_.timeout, abort_);
}

ThreadWorld::~ThreadWorld() {
  // Every handle is gone, so nobody can wait on what is still queued; fail it fast instead of
  // letting it wait out the timeout, then join the progress threads (streams_ is destroyed next).
  abort_->abort(-1, "the thread world was destroyed while operations were pending");
}

ProcessGroupPtr ThreadWorld::group(int rank) {
  CPF_CHECK(rank >= 0 && rank < size(), "ThreadWorld::group: rank ", rank, " is out of range for a world of size ",
            size());
  {
    std::lock_guard lock(mutex_);
    CPF_CHECK(!handed_out_[static_cast<size_t>(rank)], "ThreadWorld::group: rank ", rank,
              "'s handle was already created; every rank has exactly one (it counts the rank's steps), share it");
    handed_out_[static_cast<size_t>(rank)] = true;
  }
  return std::make_shared<ThreadProcessGroup>(shared_from_this(), world_state_, rank);
}

void ThreadWorld::abort(int global_rank, const std::string& reason) { abort_->abort(global_rank, reason); }

ThreadProcessGroup::ThreadProcessGroup(std::shared_ptr<ThreadWorld> world, std::shared_ptr<GroupState> state, int rank)
    : world_(std::move(world)), state_(std::move(state)), rank_(rank) {}

void ThreadProcessGroup::abort(const std::string& reason) { world_->abort(global_rank(), reason); }

template <class Body>
WorkPtr ThreadProcessGroup::submit(const char* op, bool collective, Body body) {
  auto work = std::make_shared<FutureWork>(op_context(op));
  const uint64_t seq = collective ? next_seq_++ : 0;
  // The task holds the group state, not the world or this handle: the world must never be
  // destroyed on its own progress thread.
  world_->stream(global_rank()).enqueue([state = state_, rank = rank_, seq, work, body = std::move(body)]() {
    run_into(*work, [&] {
      const OpContext ctx{*state, rank, seq, work->description()};  // allocates: a failure fails the Work
      return body(ctx);
    });
  });
  return work;
}

WorkPtr ThreadProcessGroup::do_all_reduce(const Tensor& input, ReduceOp op, const Tensor& out) {
  return submit("all_reduce", true,
                [input, op, out](const OpContext& ctx) { return run_all_reduce(ctx, input, op, out); });
}

WorkPtr ThreadProcessGroup::do_broadcast(const Tensor& input, int root, const Tensor& out) {
  return submit("broadcast", true,
                [input, root, out](const OpContext& ctx) { return run_broadcast(ctx, input, root, out); });
}

WorkPtr ThreadProcessGroup::do_all_gather(const Tensor& input, int64_t dim, const Tensor& out) {
  return submit("all_gather", true,
                [input, dim, out](const OpContext& ctx) { return run_all_gather(ctx, input, dim, out); });
}

WorkPtr ThreadProcessGroup::do_reduce_scatter(const Tensor& input, int64_t dim, ReduceOp op, const Tensor& out,
                                              int64_t out_size, const std::vector<int64_t>& splits) {
  return submit("reduce_scatter", true, [input, dim, op, out, out_size, splits](const OpContext& ctx) {
    return run_reduce_scatter(ctx, input, dim, op, out, out_size, splits);
  });
}

WorkPtr ThreadProcessGroup::do_all_to_all(const Tensor& input, int64_t split_dim, int64_t concat_dim,
                                          const Tensor& out) {
  return submit("all_to_all", true, [input, split_dim, concat_dim, out](const OpContext& ctx) {
    return run_all_to_all(ctx, input, split_dim, concat_dim, out);
  });
}

WorkPtr ThreadProcessGroup::do_batch_p2p(const std::vector<P2POp>& ops) {
  return submit("batch_p2p", false, [ops](const OpContext& ctx) { return run_batch_p2p(ctx.group, ctx.rank, ops); });
}

WorkPtr ThreadProcessGroup::do_barrier() {
  return submit("barrier", true, [](const OpContext& ctx) { return run_barrier(ctx); });
}

std::shared_ptr<ProcessGroup> ThreadProcessGroup::do_new_group(const std::vector<int>& ranks, const std::string& name) {
  auto created = std::make_shared<std::shared_ptr<GroupState>>();
  WorkPtr work = submit("new_group", true, [ranks, name, created](const OpContext& ctx) {
    *created = run_new_group(ctx, ranks, name);
    return std::vector<Tensor>{};
  });
  work->wait();
  if (!*created) return nullptr;
  const int new_rank = static_cast<int>(std::find(ranks.begin(), ranks.end(), rank_) - ranks.begin());
  return std::make_shared<ThreadProcessGroup>(world_, *created, new_rank);
}

std::shared_ptr<ProcessGroup> ThreadProcessGroup::do_split(const std::vector<std::vector<int>>& partition,
                                                           const std::string& name) {
  auto created = std::make_shared<std::shared_ptr<GroupState>>();
  WorkPtr work = submit("split", true, [partition, name, created](const OpContext& ctx) {
    *created = run_split(ctx, partition, name);
    return std::vector<Tensor>{};
  });
  work->wait();
  for (const std::vector<int>& part : partition) {
    const auto at = std::find(part.begin(), part.end(), rank_);
    if (at != part.end())
      return std::make_shared<ThreadProcessGroup>(world_, *created, static_cast<int>(at - part.begin()));
  }
  return nullptr;
}

}  // namespace cpf::dist::thread
