#include "framework/distributed/thread/mailbox.h"

#include <algorithm>

#include "framework/core/error.h"
#include "framework/distributed/thread/kernels.h"
#include "framework/tensor/ops/copy.h"

namespace cpf::dist::thread {

std::shared_ptr<Message> Mailbox::post(int src, int dst, int tag, Tensor data) {
  auto message = std::make_shared<Message>();
  message->src = src;
  message->dst = dst;
  message->tag = tag;
  message->data = std::move(data);
  {
    std::lock_guard lock(sync_.mutex());
    queue_.push_back(message);
  }
  sync_.notify_all();
  return message;
}

void Mailbox::remove(const std::shared_ptr<Message>& message) {
  const auto it = std::find(queue_.begin(), queue_.end(), message);
  if (it != queue_.end()) queue_.erase(it);
}

void Mailbox::receive(int dst, int src, int tag, const Tensor& out, const std::string& what) {
  std::unique_lock lock(sync_.mutex());
  std::shared_ptr<Message> message;
  const auto find = [&] {
    const auto it = std::find_if(queue_.begin(), queue_.end(), [&](const std::shared_ptr<Message>& m) {
      return m->src == src && m->dst == dst && m->tag == tag;
    });
    message = it == queue_.end() ? nullptr : *it;
    // A message being snapshotted stays first in line; wait for it rather than skip it.
    return message != nullptr && message->state == Message::State::posted;
  };
  sync_.wait(lock, what, sync_.global_ranks()[static_cast<size_t>(dst)], find,
             [&] { return str_cat("waiting for ", sync_.describe_ranks({src}), " to send (tag ", tag, ")"); });
  message->state = Message::State::reading;
  const Tensor data = message->data;
  lock.unlock();

  std::string error;
  if (data.shape() != out.shape() || data.dtype() != out.dtype()) {
    error = str_cat("rank ", src, " sent ", data.shape(), " ", data.dtype(), " with tag ", tag, " but rank ", dst,
                    " receives into ", out.shape(), " ", out.dtype());
  } else if (!same_view(out, data)) {
    copy_view(out, data);
  }

  lock.lock();
  message->error = error;
  message->state = Message::State::consumed;
  remove(message);
  lock.unlock();
  sync_.notify_all();
  CPF_CHECK(error.empty(), what, ": ", error);
}

void Mailbox::complete_send(const std::shared_ptr<Message>& message, const std::string& what) {
  std::unique_lock lock(sync_.mutex());
  // While the receiver copies (state reading) the tensor is in use; that copy is short and bounded.
  sync_.wait(
      lock, what, sync_.global_ranks()[static_cast<size_t>(message->src)],
      [&] { return message->state == Message::State::consumed || message->state == Message::State::posted; },
      [&] { return str_cat("waiting for ", sync_.describe_ranks({message->dst}), " to finish copying"); });
  if (message->state == Message::State::consumed) {
    CPF_CHECK(message->error.empty(), what, ": rank ", message->dst, " rejected the message: ", message->error);
    return;
  }
  // Not received yet: keep a private copy in the message so the sender's tensor is free again.
  message->state = Message::State::snapshotting;
  const Tensor data = message->data;
  lock.unlock();
  Tensor snapshot = raw::clone(data);
  lock.lock();
  message->data = std::move(snapshot);
  message->state = Message::State::posted;
  lock.unlock();
  sync_.notify_all();
}

}  // namespace cpf::dist::thread
