#include "framework/distributed/thread/rank_stream.h"

#include <cstdio>
#include <cstdlib>
#include <system_error>

#include "framework/core/error.h"

#if defined(CPF_WITH_OPENMP)
#include <omp.h>
#endif

namespace cpf::dist::thread {

RankStream::~RankStream() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void RankStream::enqueue(std::function<void()> task) {
  {
    std::lock_guard lock(mutex_);
    // Started before the task is queued: a thread that cannot start leaves nothing queued behind.
    if (!thread_.joinable()) {
      try {
        thread_ = std::thread([this] { run(); });
      } catch (const std::system_error& e) {
        CPF_FAIL("thread backend: could not start the progress thread of rank ", global_rank_, " (", e.what(),
                 "); lower the rank count (parallel.dp x parallel.cp) or raise the thread limit (ulimit -u)");
      }
    }
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void RankStream::run() {
#if defined(CPF_WITH_OPENMP)
  if (omp_threads_ > 0) omp_set_num_threads(omp_threads_);
#endif
  while (true) {
    std::function<void()> task;
    {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything queued has run
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    // Tasks report failures through their Work; one escaping here (memory exhausted while reporting)
    // has no one to tell, so it ends the process with a message instead of a bare std::terminate.
    try {
      task();
    } catch (const std::exception& e) {
      std::fprintf(stderr,
                   "cpformer: thread backend: the progress thread of rank %d failed outside its operation "
                   "(%s); aborting\n",
                   global_rank_, e.what());
      std::abort();
    }
  }
}

}  // namespace cpf::dist::thread
