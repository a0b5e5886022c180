#include "framework/distributed/thread/rank_stream.h"

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
    queue_.push_back(std::move(task));
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
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
    task();
  }
}

}  // namespace cpf::dist::thread
