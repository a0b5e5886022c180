#pragma once
// A watchdog for quiet logs: when nothing was printed for `interval`, it calls `on_silence` with
// what the trainer is doing and for how long, then waits another interval. A batch job's log
// (stdout not a terminal) thus shows a line at least every interval during a long step, evaluation
// or checkpoint, and a stuck run is told apart from a slow one by the growing "for" time.
//
// The callback runs on the heartbeat's own thread; it must do its own locking (MetricsLogger does).
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace cpf::trainer {

class Heartbeat {
 public:
  using Clock = std::chrono::steady_clock;
  // (activity, seconds since the activity began)
  using Callback = std::function<void(const std::string& activity, double activity_seconds)>;

  Heartbeat(std::chrono::duration<double> interval, Callback on_silence);
  ~Heartbeat();  // stops and joins the thread
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // What the trainer starts now ("step 13/3000", "evaluation at step 200"); restarts its timer.
  void activity(const std::string& what);
  // A line was printed: the silence starts again.
  void printed();

 private:
  void loop();

  const Clock::duration interval_;
  const Callback on_silence_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::string activity_ = "setting up (model, data, resume)";
  Clock::time_point activity_since_, last_line_;
  std::thread thread_;  // last: started once every field above is set
};

}  // namespace cpf::trainer
