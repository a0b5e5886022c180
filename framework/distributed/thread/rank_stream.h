#pragma once
// RankStream: one rank's progress thread. Operations a rank issues on any of its groups run here
// one after the other, in issue order, like kernels on one CUDA stream: the rank's own thread is
// free to compute meanwhile, and the order is the same on every rank, so collectives match up.
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace cpf::dist::thread {

class RankStream {
 public:
  // omp_threads: the OpenMP team size of copies and reductions run on this stream (0 = default).
  RankStream(int global_rank, int omp_threads) : global_rank_(global_rank), omp_threads_(omp_threads) {}
  ~RankStream();  // runs what is queued, then joins
  RankStream(const RankStream&) = delete;
  RankStream& operator=(const RankStream&) = delete;

  // Queues `task`; tasks must not throw (they report through their Work). Starts the thread lazily.
  void enqueue(std::function<void()> task);
  int global_rank() const { return global_rank_; }

 private:
  void run();

  const int global_rank_;
  const int omp_threads_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace cpf::dist::thread
