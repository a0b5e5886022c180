#include "apps/report/heartbeat.h"

namespace cpf::trainer {

Heartbeat::Heartbeat(std::chrono::duration<double> interval, Callback on_silence)
    : interval_(std::chrono::duration_cast<Clock::duration>(interval)),
      on_silence_(std::move(on_silence)),
      activity_since_(Clock::now()),
      last_line_(activity_since_),
      thread_([this] { loop(); }) {}

Heartbeat::~Heartbeat() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void Heartbeat::activity(const std::string& what) {
  std::lock_guard<std::mutex> lock(mutex_);
  activity_ = what;
  activity_since_ = Clock::now();
}

void Heartbeat::printed() {
  std::lock_guard<std::mutex> lock(mutex_);
  last_line_ = Clock::now();
}

void Heartbeat::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    const Clock::time_point due = last_line_ + interval_;
    if (Clock::now() < due) {
      wake_.wait_until(lock, due);
      continue;  // re-check: stopped, or a line was printed meanwhile
    }
    const std::string what = activity_;
    const double seconds = std::chrono::duration<double>(Clock::now() - activity_since_).count();
    last_line_ = Clock::now();
    lock.unlock();  // the callback prints, and printing calls printed()
    try {
      on_silence_(what, seconds);
    } catch (...) {
      // A failed write is reported by the trainer's next line on its own thread, which throws.
    }
    lock.lock();
  }
}

}  // namespace cpf::trainer
