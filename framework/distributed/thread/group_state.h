#pragma once
// Everything the ranks of one thread-backend group share: identity, synchronisation, the collective
// rendezvous and the point-to-point mailbox. Each rank's ThreadProcessGroup handle points to it;
// the operations queued on the ranks' progress threads keep it alive while they run.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "framework/distributed/thread/group_sync.h"
#include "framework/distributed/thread/mailbox.h"
#include "framework/distributed/thread/rendezvous.h"

namespace cpf::dist::thread {

struct GroupState {
  GroupState(std::string name, std::vector<int> global_ranks, std::chrono::milliseconds timeout,
             std::shared_ptr<AbortState> abort)
      : sync(std::make_shared<GroupSync>(std::move(name), std::move(global_ranks), timeout, std::move(abort))),
        rendezvous(*sync),
        mailbox(*sync) {}

  // A new group, registered with the world's abort state so an abort wakes its waiting ranks.
  static std::shared_ptr<GroupState> create(std::string name, std::vector<int> global_ranks,
                                            std::chrono::milliseconds timeout, std::shared_ptr<AbortState> abort) {
    auto state = std::make_shared<GroupState>(std::move(name), std::move(global_ranks), timeout, abort);
    abort->add_group(state->sync);
    return state;
  }

  std::shared_ptr<GroupSync> sync;
  Rendezvous rendezvous;
  Mailbox mailbox;
};

}  // namespace cpf::dist::thread
