#include "framework/distributed/thread/rendezvous.h"

#include <exception>

namespace cpf::dist::thread {
namespace {

std::string check_same_kind(const Round& round, uint64_t seq) {
  for (size_t r = 1; r < round.slots.size(); ++r) {
    if (round.slots[r].desc.kind != round.slots[0].desc.kind) {
      return str_cat("ranks issued different operations at step ", seq, ": rank 0 called ", round.slots[0].desc.kind,
                     ", rank ", r, " called ", round.slots[r].desc.kind,
                     "; every rank of a group must issue the same operations in the same order");
    }
  }
  return "";
}

std::vector<int> ranks_where(const Round& round, bool (*pred)(const Slot&)) {
  std::vector<int> out;
  for (size_t r = 0; r < round.slots.size(); ++r) {
    if (pred(round.slots[r])) out.push_back(static_cast<int>(r));
  }
  return out;
}

}  // namespace

std::shared_ptr<Round> Rendezvous::arrive(uint64_t seq, int rank, Slot slot, const Validator& validate,
                                          const std::string& what) {
  const int n = sync_.size();
  std::unique_lock lock(sync_.mutex());
  std::shared_ptr<Round>& entry = rounds_[seq];
  if (!entry) entry = std::make_shared<Round>(n);
  std::shared_ptr<Round> round = entry;
  slot.arrived = true;
  slot.done = false;
  round->slots[static_cast<size_t>(rank)] = std::move(slot);
  if (++round->arrived == n) {
    round->error = check_same_kind(*round, seq);
    if (round->error.empty()) {
      try {
        round->error = validate(*round);
      } catch (const std::exception& e) {
        round->error = e.what();
      }
    }
    sync_.notify_all();
  }
  const int global = sync_.global_ranks()[static_cast<size_t>(rank)];
  sync_.wait(
      lock, what, global, [&] { return round->arrived == n; },
      [&] {
        return str_cat("at step ", seq, " waiting for ",
                       sync_.describe_ranks(ranks_where(*round, [](const Slot& s) { return !s.arrived; })),
                       " to arrive");
      });
  if (!round->error.empty()) {
    const std::string error = round->error;
    if (++round->left == n) rounds_.erase(seq);
    lock.unlock();
    CPF_FAIL(what, ": ", error);
  }
  return round;
}

void Rendezvous::finish(uint64_t seq, const std::shared_ptr<Round>& round, int rank, const std::string& what) {
  const int n = sync_.size();
  std::unique_lock lock(sync_.mutex());
  round->slots[static_cast<size_t>(rank)].done = true;
  if (++round->done == n) sync_.notify_all();
  const int global = sync_.global_ranks()[static_cast<size_t>(rank)];
  sync_.wait(
      lock, what, global, [&] { return round->done == n; },
      [&] {
        return str_cat("at step ", seq, " waiting for ",
                       sync_.describe_ranks(ranks_where(*round, [](const Slot& s) { return !s.done; })),
                       " to finish their part");
      });
  if (++round->left == n) rounds_.erase(seq);
}

}  // namespace cpf::dist::thread
