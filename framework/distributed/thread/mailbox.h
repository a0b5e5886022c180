#pragma once
// Point-to-point messages of a thread-backend group.
//
// A send posts a reference to the sender's tensor, with no copy. The receiver copies straight from
// it into its buffer (one copy in all). A send completes when the receiver has copied; if the
// sender needs to complete first (its wait comes before the matching receive, as in a ring where
// every rank sends then receives), it snapshots the tensor into the message and moves on. So a send
// never waits for its receiver, and no order of sends and receives can deadlock as long as every
// receive has a matching send.
//
// Messages from one source to one destination with one tag are received in the order they were sent.
#include <deque>
#include <memory>
#include <string>

#include "framework/distributed/thread/group_sync.h"
#include "framework/tensor/tensor.h"

namespace cpf::dist::thread {

struct Message {
  enum class State { posted, snapshotting, reading, consumed };
  int src = 0;
  int dst = 0;
  int tag = 0;
  Tensor data;  // the sender's tensor, or a snapshot of it once the sender completed
  State state = State::posted;
  std::string error;  // why the receiver rejected it
};

class Mailbox {
 public:
  explicit Mailbox(GroupSync& sync) : sync_(sync) {}

  std::shared_ptr<Message> post(int src, int dst, int tag, Tensor data);
  // Waits for the first message from `src` to `dst` with `tag` and copies it into `out`, whose shape
  // and dtype must match the sent tensor's (otherwise both sides get an error naming both).
  void receive(int dst, int src, int tag, const Tensor& out, const std::string& what);
  // Returns once the sender may reuse its tensor. Throws when the receiver rejected the message.
  void complete_send(const std::shared_ptr<Message>& message, const std::string& what);

 private:
  void remove(const std::shared_ptr<Message>& message);  // mutex held

  GroupSync& sync_;
  std::deque<std::shared_ptr<Message>> queue_;  // not yet consumed, in post order; guarded by sync_.mutex()
};

}  // namespace cpf::dist::thread
