#pragma once
// Non-blocking communicators (private to framework/distributed/nccl: includes nccl.h).
//
// Every communicator of this backend is created with ncclConfig_t::blocking = 0, so no NCCL call
// blocks the host: creation, ncclCommSplit, a collective or a group end return at once (often
// ncclInProgress) while NCCL does the work on a thread of its own, and the communicator's state
// (ncclCommGetAsyncError) stays ncclInProgress until it is done. NCCL's rules for such a
// communicator, which every call site here follows (NcclRankState::run):
//   - after any call on it, poll ncclCommGetAsyncError until it leaves ncclInProgress before the
//     next NCCL call on it and before enqueueing work on the streams it uses; ncclSuccess = done,
//     anything else = the communicator failed and must be aborted;
//   - ncclCommSplit may return ncclSuccess before the split is done: the parent's state says when
//     (and the child pointer is written only then);
//   - ncclCommAbort (and ncclCommDestroy) stay blocking; an abort stops work in progress, including
//     a creation or split waiting for a rank that never comes.
// So every wait has a bound: a creation or split that a rank never joins ends in an error naming it.
// The price: NCCL 2.28 hands each ncclGroupEnd of a non-blocking communicator (a lone collective is
// an implicit group) to a thread it starts for that call, which launches the kernels while the caller
// polls (gpu_nccl_post_bench measures what that costs). An operation's last calls defer that poll
// (NcclRankState::run_deferred) to the communicator's next use, the Work or the watchdog.
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include "framework/distributed/nccl/function_ref.h"
#include "framework/distributed/nccl/nccl_rank_state.cuh"

namespace cpf::dist::nccl {

// The configuration of every communicator created here: non-blocking, the rest NCCL's defaults.
ncclConfig_t nonblocking_config();

// A status that is neither ncclSuccess nor ncclInProgress.
inline bool nccl_failed(ncclResult_t status) { return status != ncclSuccess && status != ncclInProgress; }

// ncclGroupStart, `post` (the grouped calls; returns the first failing status, or ncclSuccess), then
// ncclGroupEnd, which also runs after a failure so the thread's group is closed (it then drops what
// was posted and returns the failure). Returns the first failure, else ncclGroupEnd's status.
ncclResult_t in_group(FunctionRef<ncclResult_t()> post);

// The pause between two polls of a communicator's state. An enqueue on a non-blocking communicator
// returns ncclInProgress while NCCL launches it on a thread of its own (tens of microseconds), and
// ncclCommGetAsyncError is an atomic load: so the polls first spin (ask again at once) for kSpinFor,
// then yield a while, then sleep, the sleeps growing to 1 ms (creation and splits take seconds).
class PollPause {
 public:
  void operator()() {
    if (spinning_) {
      if (std::chrono::steady_clock::now() - start_ < kSpinFor) return;
      spinning_ = false;
    }
    if (yields_ < kYields) {
      ++yields_;
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(sleep_ * 2, std::chrono::microseconds(1000));
  }

 private:
  static constexpr std::chrono::microseconds kSpinFor{200};
  static constexpr int kYields = 200;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  bool spinning_ = true;
  int yields_ = 0;
  std::chrono::microseconds sleep_{20};
};

// Why a world creation has not completed yet: `absent()` names the ranks known not to have begun
// creating their communicator ("" when none is known missing); `stalled` is the likely cause once
// every rank has begun.
struct CreationWatch {
  std::function<std::string()> absent;
  std::string stalled;
};

// The least time a world creation gets once every rank has begun: NCCL's own setup (topology,
// connections) takes seconds on large worlds, longer than the short timeouts tests use.
inline constexpr std::chrono::milliseconds kCreationFloor{60'000};

// Creates this rank's communicator of `world_size` ranks over `id` on the current device
// (ncclCommInitRankConfig, non-blocking) and waits until it is ready: at most `timeout` while
// watch.absent() names a missing rank, at most max(timeout, kCreationFloor) otherwise. Polls
// `domain` meanwhile: when another rank of the process failed (or a peer process died), it stops at
// once. On an NCCL error, the abort or the timeout it aborts the half-made communicator and throws
// "<what> ...", the timeout naming the absent ranks or the stall.
ncclComm_t create_communicator(int world_size, const ncclUniqueId& id, int rank, std::chrono::milliseconds timeout,
                               const AbortDomain& domain, const std::string& what, const CreationWatch& watch);

}  // namespace cpf::dist::nccl
