#pragma once
// One rank's NCCL state, shared by every group of that rank: its device, its communicators, the
// operations still in flight, and the abort that ends them all.
//
// Failure handling: a watchdog thread polls every communicator's asynchronous error
// (ncclCommGetAsyncError) and the age of every operation in flight. An error, an operation older
// than the timeout, or an abort from elsewhere (another rank thread of an in-process launch, the
// user) aborts every communicator of the rank (ncclCommAbort, which also makes NCCL kernels that
// wait for a dead peer return), and every later operation or wait() throws the reason. An
// AbortDomain joins the ranks of one process: the first abort of one is the abort of all.
//
// Communicators are non-blocking (nccl_ready.cuh): every NCCL call on one goes through run(),
// which holds the rank's lock for the call (the watchdog's polls and the aborts take it too: NCCL
// allows one caller per communicator at a time) and then waits, bounded, until the communicator is
// ready again; or, for an operation's last calls, through run_deferred, which leaves that wait to the
// next use of the communicator, the operation's Work, or the watchdog (nccl_deferred_launch.cpp).
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "framework/distributed/nccl/function_ref.h"

namespace cpf::dist::nccl {

class NcclRankState;

// The ranks of this process that fail together.
class AbortDomain {
 public:
  // First call wins; aborts every registered rank's communicators. `rank` < 0: no rank to blame.
  void abort(int rank, const std::string& reason);
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  std::string reason() const;  // "rank 1 failed: <reason>", or "" while not aborted
  void add(std::weak_ptr<NcclRankState> rank);

  // Group creation's arrival board, for groups whose ranks all run in this process: rank
  // `global_rank` reached its `count`-th new_group on the group `group_id` (an id every rank of
  // the group derives alike) asking for `fingerprint`; waits until every rank of `global_ranks`
  // has reached it, the domain is aborted, or `timeout` passed.
  struct NewGroupMeeting {
    std::vector<int> absent;              // ranks that did not reach it in time (empty: all met)
    std::map<int, int64_t> fingerprints;  // by global rank, once all met
  };
  NewGroupMeeting meet_at_new_group(const std::string& group_id, int global_rank, int count, int64_t fingerprint,
                                    const std::vector<int>& global_ranks, std::chrono::milliseconds timeout);
  // Of `global_ranks`, those not running in this process (no rank state of theirs joined it).
  std::vector<int> not_in_this_process(const std::vector<int>& global_ranks) const;

 private:
  mutable std::mutex mutex_;
  std::atomic<bool> aborted_{false};
  int failed_rank_ = -1;
  std::string reason_;
  std::vector<std::weak_ptr<NcclRankState>> ranks_;
  std::vector<int> global_ranks_;  // of ranks_, as they joined
  struct Arrival {
    int count = 0;
    int64_t fingerprint = 0;
  };
  std::map<std::string, std::map<int, Arrival>> new_group_arrivals_;  // group id -> global rank -> latest
  std::condition_variable arrived_;                                   // a new arrival, or the abort
};

// Makes `device` current and restores the previous device; never throws (for destructors and for
// aborts that run on other ranks' threads).
class QuietDeviceGuard {
 public:
  explicit QuietDeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    cudaSetDevice(device);
  }
  ~QuietDeviceGuard() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  QuietDeviceGuard(const QuietDeviceGuard&) = delete;
  QuietDeviceGuard& operator=(const QuietDeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

class CompletionEvent;

// A communicator of one group; aborted communicators are never used or destroyed again.
struct Communicator {
  ncclComm_t comm = nullptr;
  std::string group;  // for messages
  std::atomic<bool> aborted{false};
  // A launch NCCL's thread may still be doing (NcclRankState::run_deferred): the operation whose
  // completion is recorded on `pending_stream` once the communicator is ready. Under the rank's
  // lock; null when none. An abort drops it (its event is then never recorded).
  std::shared_ptr<CompletionEvent> pending;
  cudaStream_t pending_stream = nullptr;
  const char* pending_call = nullptr;  // a literal, for messages
};

// The CUDA events (no timing) of one device, reused: creating and destroying one per operation
// cost two driver calls on every posted operation. An event goes back once nothing refers to it any
// more (a stream wait on it has captured its record already, so recording it again is harmless).
class EventPool {
 public:
  explicit EventPool(int device) : device_(device) {}
  ~EventPool();
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;
  // An event of this device (the caller has it current when a new one must be created).
  cudaEvent_t acquire();
  void release(cudaEvent_t event);  // never throws

 private:
  static constexpr size_t kKept = 256;  // more free events than this are destroyed
  const int device_;
  std::mutex mutex_;
  std::vector<cudaEvent_t> free_;
};

// An operation's completion: an event from the pool, back there with its last owner. A Work and the
// watchdog share it, so an operation stays watched after its Work is gone (the blocking forms drop
// theirs at once). `description` names the operation in every message about it.
class CompletionEvent {
 public:
  CompletionEvent(std::shared_ptr<EventPool> pool, std::string description);
  ~CompletionEvent();
  CompletionEvent(const CompletionEvent&) = delete;
  CompletionEvent& operator=(const CompletionEvent&) = delete;
  cudaEvent_t get() const { return event_; }
  const std::string& description() const { return description_; }
  // Records the event on `stream`; until then the operation counts as in flight (its host-side NCCL
  // calls may block, e.g. while connecting to a peer).
  void record(cudaStream_t stream);
  bool recorded() const { return recorded_.load(std::memory_order_acquire); }

 private:
  const std::shared_ptr<EventPool> pool_;
  const std::string description_;
  cudaEvent_t event_ = nullptr;
  std::atomic<bool> recorded_{false};
};

// An operation in flight, as the watchdog sees it (named by done->description()).
struct InFlight {
  std::shared_ptr<CompletionEvent> done;
  std::chrono::steady_clock::time_point issued;
};

// What a wait that runs out of time blames: a fixed text, or one computed then (e.g. the ranks that
// have not arrived by that time). A literal is kept as a pointer: the default cause is passed to
// every NCCL call and must not allocate.
class StallCause {
 public:
  StallCause(const char* literal) : literal_(literal) {}
  StallCause(std::string text) : text_(std::move(text)) {}
  explicit StallCause(std::function<std::string()> compute) : compute_(std::move(compute)) {}
  std::string operator()() const {
    if (compute_) return compute_();
    return literal_ ? std::string(literal_) : text_;
  }

 private:
  const char* literal_ = nullptr;
  std::string text_;
  std::function<std::string()> compute_;
};

class NcclRankState : public std::enable_shared_from_this<NcclRankState> {
 public:
  static std::shared_ptr<NcclRankState> create(int device, int global_rank, int world_size,
                                               std::chrono::milliseconds timeout, std::shared_ptr<AbortDomain> domain);
  ~NcclRankState();
  NcclRankState(const NcclRankState&) = delete;
  NcclRankState& operator=(const NcclRankState&) = delete;

  int device() const { return device_; }
  int global_rank() const { return global_rank_; }
  int world_size() const { return world_size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  const std::shared_ptr<AbortDomain>& domain() const { return domain_; }

  bool aborted() const { return domain_->aborted(); }
  // Throws "<context>: the NCCL world was aborted: <reason>" once aborted.
  void check_alive(const std::string& context) const;
  // Aborts the whole domain, blaming this rank.
  void abort(const std::string& reason) { domain_->abort(global_rank_, reason); }

  // Registers a group's communicator. It stays registered (polled, aborted with the rank) until
  // this rank state ends, also after its group's handle is gone: the destructor destroys them all.
  // Why not earlier: with several ranks of a communicator in one process, NCCL frees all of them in
  // the last one's ncclCommDestroy and waits for each of their GPUs to go idle; a rank that already
  // moved on to a collective needing the destroying rank keeps its GPU busy forever (a deadlock, and
  // the destroying thread cannot be aborted). Once a rank state ends, its rank issues nothing more.
  std::shared_ptr<Communicator> add_communicator(ncclComm_t comm, const std::string& group);
  void track(InFlight op);
  // The events of this rank's device, for the operations of every group (nccl_process_group.cpp).
  const std::shared_ptr<EventPool>& events() const { return events_; }

  // What a collective that does not get ready in time most likely waits for.
  static constexpr const char* kPeerStallCause = "a peer rank died, hangs, or issued different operations";

  // NCCL calls on `comm` (a communicator of this rank): runs `calls`, which return the first failing
  // status (else the last one), under the rank's lock, then polls `comm` until it is ready again,
  // at most the timeout: a non-blocking communicator may not be used (nor its streams given work)
  // before. `call` names the calls in errors ("<context>: <call> failed: ..."). An NCCL error while
  // waiting, or the timeout (whose message ends with `stall_cause`), aborts the world and throws;
  // an abort from elsewhere throws its reason. Every communicator of the rank is aborted before it
  // throws, so NCCL's own thread no longer runs then.
  // Finishes `comm`'s pending launch first (finish_launch), as every path to NCCL here does.
  void run(Communicator& comm, std::string_view call, FunctionRef<ncclResult_t()> calls, const std::string& context,
           const StallCause& stall_cause = kPeerStallCause);

  // Deferred launch (nccl_deferred_launch.cpp): as run(), for an operation's last NCCL calls, after
  // which nothing is queued on `stream` (the operation's communication stream) before `done` is
  // recorded there. When NCCL's thread is still launching them, it does not poll (the ~70 µs a post
  // costs on a non-blocking communicator) but leaves the launch pending on `comm` and returns; else
  // it records `done` at once. A pending launch is finished, so `done` recorded, by finish_launch,
  // try_finish_launch or the watchdog's next poll (kWatchdogPeriod), whichever comes first; until
  // then the operation counts as in flight (the watchdog's timeout covers a launch that never ends).
  // `call` is a literal (kept for messages). Errors: as run(), named by done->description().
  void run_deferred(Communicator& comm, const char* call, FunctionRef<ncclResult_t()> calls,
                    const std::shared_ptr<CompletionEvent>& done, cudaStream_t stream);
  // Finishes `comm`'s pending launch, if any: polls, bounded by the timeout as run() does, until the
  // communicator is ready, then records the pending operation's event. Before any NCCL call on `comm`
  // and before anything is queued on its stream. A failure or the timeout aborts the world and throws.
  void finish_launch(Communicator& comm);
  // Finishes it only if the communicator is ready now (one poll): true when nothing is pending any
  // more. Never throws: a failure aborts the world (then false).
  bool try_finish_launch(Communicator& comm) noexcept;

  // Blocks the host until `event` completed, bounded by the timeout; checks for aborts and NCCL
  // errors meanwhile. A timeout aborts the world and throws "<context> did not complete within the
  // timeout of <t> s: <stall_cause>" (by default: a peer died, hangs or issued other operations).
  void host_wait(cudaEvent_t event, const std::string& context, const StallCause& stall_cause = kPeerStallCause);

 private:
  friend class AbortDomain;
  NcclRankState(int device, int global_rank, int world_size, std::chrono::milliseconds timeout,
                std::shared_ptr<AbortDomain> domain);
  // Aborts every communicator of the rank not aborted yet; returns once each is (also when another
  // thread is aborting them): called by the domain, and by run() before it throws.
  void abort_communicators();
  void wait_ready(Communicator& comm, const std::string& context, std::string_view call, const StallCause& stall_cause);
  // After `calls` returned `status`: a failure aborts the world and throws "<context>: <call> failed: ...".
  void fail_on_call_error(ncclResult_t status, const std::string& context, std::string_view call);
  // Under mutex_: records comm.pending on its stream and clears the slot; "" or why recording failed.
  static std::string record_pending_locked(Communicator& comm);
  // A failure found while finishing a launch: aborts the world (outside mutex_) and throws it.
  [[noreturn]] void fail_launch(const std::string& reason);
  static void watchdog_loop(std::weak_ptr<NcclRankState> weak);
  void watch_once();
  // "" when every communicator is healthy, else a message naming the group and NCCL's error.
  std::string poll_async_errors();

  const int device_, global_rank_, world_size_;
  const std::chrono::milliseconds timeout_;
  const std::shared_ptr<AbortDomain> domain_;
  const std::shared_ptr<EventPool> events_;

  std::mutex mutex_;
  std::vector<std::shared_ptr<Communicator>> comms_;
  std::vector<InFlight> in_flight_;
  std::thread watchdog_;
};

}  // namespace cpf::dist::nccl
