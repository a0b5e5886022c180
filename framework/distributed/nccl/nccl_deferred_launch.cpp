// NcclRankState's deferred launches (issue #21): an operation's last NCCL calls return without
// waiting for NCCL's launch thread, and the operation's completion event is recorded once the
// communicator is ready again.
//
// Why: on a non-blocking communicator every ncclGroupEnd (a lone collective is an implicit group)
// hands the launch to a thread NCCL starts for it and returns ncclInProgress; polling until that
// thread is done cost ~70 µs of host time per post on 2 x H100 (gpu_nccl_post_bench). NCCL's rule
// is only that nothing is called on the communicator, and nothing queued on its stream, before it is
// ready: so the poll moves to the next such use (finish_launch), to the Work's wait, or to the
// watchdog, whichever comes first. Every one of them is bounded as before.
//
// The pending slot (Communicator::pending) is only read and written under the rank's lock: the
// rank's thread sets and finishes it, the watchdog finishes it, an abort drops it.
#include "framework/core/error.h"
#include "framework/distributed/nccl/nccl_rank_state.cuh"
#include "framework/distributed/nccl/nccl_ready.cuh"

namespace cpf::dist::nccl {

void NcclRankState::fail_on_call_error(ncclResult_t status, const std::string& context, std::string_view call) {
  if (!nccl_failed(status)) return;
  // On a non-blocking communicator a failed call leaves its error as the communicator's state (every
  // later call fails, and ncclCommDestroy refuses it): abort the world with this reason, as the polls
  // do for NCCL's own failures, so the peers learn why and nothing leaks.
  const std::string reason = str_cat(context, ": ", call, " failed: ", ncclGetErrorString(status), " (ncclResult ",
                                     static_cast<int>(status), ")");
  abort(reason);
  abort_communicators();
  CPF_FAIL(reason);
}

std::string NcclRankState::record_pending_locked(Communicator& comm) {
  const std::shared_ptr<CompletionEvent> done = std::move(comm.pending);
  comm.pending.reset();
  if (!done) return "";
  try {
    done->record(comm.pending_stream);
  } catch (const std::exception& e) {
    return str_cat(done->description(), ": recording its completion after NCCL's launch failed: ", e.what());
  }
  return "";
}

void NcclRankState::fail_launch(const std::string& reason) {
  abort(reason);
  abort_communicators();
  CPF_FAIL(reason);
}

void NcclRankState::run_deferred(Communicator& comm, const char* call, FunctionRef<ncclResult_t()> calls,
                                 const std::shared_ptr<CompletionEvent>& done, cudaStream_t stream) {
  finish_launch(comm);  // at most one launch is pending per communicator
  const std::string& context = done->description();
  ncclResult_t status = ncclSuccess;
  ncclResult_t state = ncclInProgress;
  bool was_aborted = false;
  std::string failed;
  {
    std::lock_guard lock(mutex_);
    was_aborted = comm.aborted.load();
    if (!was_aborted) {
      status = calls();
      if (!nccl_failed(status)) {
        const ncclResult_t asked = ncclCommGetAsyncError(comm.comm, &state);
        if (asked != ncclSuccess) state = asked;
      }
      if (!nccl_failed(status) && !nccl_failed(state)) {
        comm.pending = done;
        comm.pending_stream = stream;
        comm.pending_call = call;
        if (state == ncclSuccess) failed = record_pending_locked(comm);  // launched already
      }
    }
  }
  if (was_aborted) CPF_FAIL(context, ": the NCCL world was aborted (", domain_->reason(), ")");
  fail_on_call_error(status, context, call);
  if (!failed.empty()) fail_launch(failed);
  // NCCL's thread failed: the poll reports it (aborting the world) and throws.
  if (nccl_failed(state)) wait_ready(comm, context, call, kPeerStallCause);
  CPF_CHECK(!nccl_failed(state), context, ": ", call, " failed: ", ncclGetErrorString(state));
}

void NcclRankState::finish_launch(Communicator& comm) {
  std::shared_ptr<CompletionEvent> done;
  const char* call = nullptr;
  {
    std::lock_guard lock(mutex_);
    if (!comm.pending) return;
    done = comm.pending;
    call = comm.pending_call;
  }
  // Bounded as run()'s poll; an abort (which drops the slot) or a failure throws from here.
  wait_ready(comm, done->description(), call, kPeerStallCause);
  std::string failed;
  {
    std::lock_guard lock(mutex_);
    // Else the watchdog recorded it meanwhile, or an abort dropped it after the poll.
    if (comm.pending == done) failed = record_pending_locked(comm);
  }
  if (!failed.empty()) fail_launch(failed);
}

bool NcclRankState::try_finish_launch(Communicator& comm) noexcept {
  std::string failed;
  {
    std::lock_guard lock(mutex_);
    if (!comm.pending) return true;
    if (comm.aborted.load()) return false;
    ncclResult_t state = ncclInProgress;
    const ncclResult_t asked = ncclCommGetAsyncError(comm.comm, &state);
    if (asked != ncclSuccess) state = asked;
    if (state == ncclInProgress) return false;
    if (state == ncclSuccess) {
      failed = record_pending_locked(comm);
    } else {
      failed = str_cat(comm.pending->description(), ": ", comm.pending_call, " failed: ", ncclGetErrorString(state),
                       " (ncclResult ", static_cast<int>(state), ") (a peer rank may have died or be unreachable)");
    }
  }
  if (failed.empty()) return true;
  try {
    abort(failed);
    abort_communicators();
  } catch (...) {
  }
  return false;
}

}  // namespace cpf::dist::nccl
