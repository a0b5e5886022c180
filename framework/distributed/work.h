#pragma once
// Work: the handle of an asynchronous collective or point-to-point operation.
//
//   WorkPtr w = pg.all_reduce_async(grad);   // returns at once; the data moves in the background
//   ...compute that does not touch grad...
//   Tensor sum = w->wait_tensor();           // blocks; rethrows the operation's error, if any
//
// Until wait() returns, the operation owns its tensors: the caller must neither write the inputs
// nor read or write the outputs. Every Work must be waited on (or the group aborted): a rank that
// drops a handle leaves nothing undone on the thread backend, but on device backends the output
// is only ordered with the caller's stream by wait().
//
// Backends: the thread backend completes a FutureWork from the rank's progress thread, and wait()
// blocks the calling thread. A device backend (NCCL) completes on its communication stream, and
// wait() makes the caller's current stream wait for it, as torch.distributed does.
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "framework/tensor/tensor.h"

namespace cpf::dist {

class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the operation finished and rethrows its error (every call rethrows it again).
  virtual void wait() = 0;
  // True once the operation finished, successfully or not; never blocks.
  virtual bool is_completed() const = 0;
  // The operation's outputs once completed: the result tensor of a collective, the receive buffers
  // of a batched point-to-point call in the order of its receives, nothing for barrier and send.
  // Throws when called before completion or after a failure.
  virtual const std::vector<Tensor>& result() const = 0;
  // wait(), then the single result tensor.
  Tensor wait_tensor();
  // A name for messages, e.g. "all_reduce on group 'world'".
  virtual const std::string& description() const = 0;
};

using WorkPtr = std::shared_ptr<Work>;

// A Work completed by another thread exactly once, with results or with an exception.
class FutureWork final : public Work {
 public:
  explicit FutureWork(std::string description) : description_(std::move(description)) {}
  void wait() override;
  bool is_completed() const override;
  const std::vector<Tensor>& result() const override;
  const std::string& description() const override { return description_; }

  // Called once by the thread that ran the operation. fail() keeps the error's text, not the
  // exception object: wait() throws a new cpf::Error on the waiting thread, so no exception object
  // is shared between threads (libstdc++'s exception and string reference counts are invisible to
  // ThreadSanitizer, which would report their release as a race). Other exception types arrive as
  // cpf::Error with their what().
  void complete(std::vector<Tensor> results);
  void fail(std::exception_ptr error);

 private:
  const std::string description_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::vector<Tensor> results_;
  bool failed_ = false;
  std::string error_file_, error_condition_, error_message_;
  int error_line_ = 0;
};

// Runs `body` and completes `work` with its results, or fails it with the exception it threw.
template <class Body>
void run_into(FutureWork& work, Body&& body) noexcept {
  std::vector<Tensor> results;
  try {
    results = body();
  } catch (...) {
    work.fail(std::current_exception());
    return;
  }
  work.complete(std::move(results));
}

}  // namespace cpf::dist
