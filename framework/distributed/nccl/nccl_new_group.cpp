// NcclProcessGroup::new_group: a sub-group over ncclCommSplit, in two bounded steps.
//
// 1. Meet (when every rank of this group runs in this process, as under dist::launch): each rank
//    posts its arrival at its k-th new_group on this group, with a fingerprint of the call (k, the
//    ranks, the name), on the process's arrival board (AbortDomain) and waits for the others, at
//    most the timeout. A rank that never comes ends it with a message naming the group, the
//    operation and the ranks that did not arrive; fingerprints that differ fail every rank at once,
//    naming the ranks that asked for another group, where ncclCommSplit would hang or build groups
//    the ranks disagree on. Host-side on purpose: an NCCL collective with an absent peer would have
//    to be aborted mid-connection, which NCCL does not promise to end.
// 2. Split: ncclCommSplit over this group (collective over the parent: every rank calls it, those
//    outside `ranks` with NCCL_SPLIT_NOCOLOR), non-blocking and polled through the parent's state,
//    at most the timeout. After step 1 a stall here is NCCL's own; for a group with ranks in other
//    processes (no meeting possible from here) its message names those ranks as unseen.
#include <algorithm>
#include <cstdint>

#include "framework/core/error.h"
#include "framework/distributed/nccl/nccl_process_group.cuh"
#include "framework/tensor/cuda/runtime.cuh"

namespace cpf::dist::nccl {
namespace {

// FNV-1a over what the ranks of one new_group must agree on.
int64_t new_group_fingerprint(int count, const std::vector<int>& ranks, const std::string& name) {
  uint64_t hash = 14695981039346656037ull;
  const auto eat = [&hash](uint64_t value) {
    for (int byte = 0; byte < 8; ++byte) {
      hash ^= (value >> (8 * byte)) & 0xff;
      hash *= 1099511628211ull;
    }
  };
  eat(static_cast<uint64_t>(count));
  eat(ranks.size());
  for (int r : ranks) eat(static_cast<uint64_t>(static_cast<uint32_t>(r)));
  eat(name.size());
  for (char c : name) eat(static_cast<unsigned char>(c));
  return static_cast<int64_t>(hash);
}

}  // namespace

std::string NcclProcessGroup::describe_members(const std::vector<int>& globals) const {
  std::vector<int> local;
  for (int g : globals) {
    local.push_back(static_cast<int>(std::find(global_ranks_.begin(), global_ranks_.end(), g) - global_ranks_.begin()));
  }
  if (local.size() == 1) return str_cat("rank ", local[0], " (global ", globals[0], ")");
  return str_cat("ranks ", local, " (global ", globals, ")");
}

void NcclProcessGroup::meet_for_new_group(const std::vector<int>& ranks, const std::string& name, int count,
                                          const std::string& new_name, const std::string& context) {
  const AbortDomain::NewGroupMeeting meeting = state_->domain()->meet_at_new_group(
      id_, global_rank(), count, new_group_fingerprint(count, ranks, name), global_ranks_, state_->timeout());
  state_->check_alive(context);  // aborted while meeting: another rank failed
  if (!meeting.absent.empty()) {
    const std::string reason =
        str_cat(context, ": ", describe_members(meeting.absent), " did not arrive at new_group #", count,
                " on this group (before ncclCommSplit into '", new_name, "') within the timeout of ",
                static_cast<double>(state_->timeout().count()) / 1000.0, " s; every rank of ", describe(),
                " must call new_group with the same ranks, in the same order (a rank that failed, returned or ",
                "waits in another operation never does)");
    state_->abort(reason);
    CPF_FAIL(reason);
  }
  const int64_t mine = meeting.fingerprints.at(global_rank());
  std::vector<int> differ;
  for (const auto& [global, print] : meeting.fingerprints) {
    if (print != mine) differ.push_back(global);
  }
  // Every rank sees a difference when any exists, so all of them throw here; none went on to split.
  CPF_CHECK(differ.empty(), context, ": ", describe_members(differ), " called new_group with other ranks, another ",
            "name or at another point than ", describe_members({global_rank()}), " (ranks ", ranks, ", name '", name,
            "', new_group #", count,
            " on this group); every rank must call new_group with the same ranks and name, in ", "the same order");
}

// What a split that does not complete blames.
std::string NcclProcessGroup::split_stall_cause() const {
  const std::vector<int> elsewhere = state_->domain()->not_in_this_process(global_ranks_);
  if (elsewhere.empty()) {
    return str_cat("every rank of ", describe(), " arrived at this new_group, but NCCL did not finish ",
                   "creating the communicator (NCCL_DEBUG=WARN tells more)");
  }
  return str_cat("every rank of ", describe(), " must call new_group with the same ranks, in the same order; ",
                 describe_members(elsewhere), " run in other processes, whose arrival this process cannot ",
                 "see: one of them never called it (it failed, returned, or waits in another operation)");
}

std::shared_ptr<ProcessGroup> NcclProcessGroup::do_new_group(const std::vector<int>& ranks, const std::string& name) {
  const std::string context = op_context("new_group");
  state_->check_alive(context);
  const int count = ++new_groups_;
  const auto it = std::find(ranks.begin(), ranks.end(), rank_);
  const bool member = it != ranks.end();
  // Members get a communicator ranked by their position in `ranks` (NCCL orders by key).
  const int key = member ? static_cast<int>(it - ranks.begin()) : 0;
  std::vector<int> globals;
  for (int r : ranks) globals.push_back(global_ranks_[static_cast<size_t>(r)]);
  const std::string group_name = name.empty() ? str_cat(name_, "/", globals) : name;
  cuda::DeviceGuard guard(state_->device());
  if (state_->domain()->not_in_this_process(global_ranks_).empty()) {
    meet_for_new_group(ranks, name, count, group_name, context);
  }
  // Non-blocking (the child inherits the parent's configuration): NCCL writes `child` on its own
  // thread when the split is done, which the parent's state tells; a failure or the timeout
  // aborts the parent (run() does, stopping that thread) before it throws.
  ncclComm_t child = nullptr;
  const int color = member ? 0 : NCCL_SPLIT_NOCOLOR;
  try {
    run_nccl(
        str_cat("ncclCommSplit of ", describe(), " into '", group_name, "' (global ranks ", globals, ")"),
        [&] { return ncclCommSplit(comm_->comm, color, key, &child, nullptr); }, context, split_stall_cause());
  } catch (...) {
    // NCCL may have written the child before the abort: it is not registered anywhere, so abort it here
    // (stops its proxy thread, frees its buffers) instead of leaking it.
    if (child != nullptr) (void)ncclCommAbort(child);
    throw;
  }
  if (!member) return nullptr;
  CPF_CHECK(child != nullptr, context, ": ncclCommSplit returned no communicator for member rank ", rank_);
  return std::make_shared<NcclProcessGroup>(state_, child, key, std::move(globals), group_name,
                                            str_cat(id_, "/", count));
}

}  // namespace cpf::dist::nccl
