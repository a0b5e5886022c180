#include "framework/distributed/work.h"

#include "framework/core/error.h"

namespace cpf::dist {

Tensor Work::wait_tensor() {
  wait();
  const std::vector<Tensor>& out = result();
  CPF_CHECK(out.size() == 1, description(), ": wait_tensor() needs exactly one result, the operation produced ",
            out.size(), "; use wait() and result()");
  return out.front();
}

void FutureWork::wait() {
  std::unique_lock lock(mutex_);
  // No deadline here: the progress thread bounds every wait it makes with the group's timeout and
  // then fails this work, so done_ always becomes true.
  cv_.wait(lock, [&] { return done_; });
  if (failed_) throw Error(error_file_, error_line_, error_condition_, error_message_);
}

bool FutureWork::is_completed() const {
  std::lock_guard lock(mutex_);
  return done_;
}

const std::vector<Tensor>& FutureWork::result() const {
  std::lock_guard lock(mutex_);
  CPF_CHECK(done_, description_, ": result() before the operation completed; call wait() first");
  CPF_CHECK(!failed_, description_, ": result() of an operation that failed; wait() rethrows its error");
  return results_;
}

void FutureWork::complete(std::vector<Tensor> results) {
  {
    std::lock_guard lock(mutex_);
    results_ = std::move(results);
    done_ = true;
  }
  cv_.notify_all();
}

void FutureWork::fail(std::exception_ptr error) {
  std::string file = __FILE__, condition, message;
  int line = __LINE__;
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    file = e.file();
    line = e.line();
    condition = e.condition();
    message = e.message();
  } catch (const std::exception& e) {
    message = e.what();
  } catch (...) {
    message = description_ + ": failed with an exception that is not a std::exception";
  }
  error = nullptr;  // the exception object dies on this thread
  {
    std::lock_guard lock(mutex_);
    failed_ = true;
    error_file_ = std::move(file);
    error_line_ = line;
    error_condition_ = std::move(condition);
    error_message_ = std::move(message);
    done_ = true;
  }
  cv_.notify_all();
}

}  // namespace cpf::dist
