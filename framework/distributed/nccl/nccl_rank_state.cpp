#include "framework/distributed/nccl/nccl_rank_state.cuh"

#include <algorithm>

#include "framework/core/error.h"
#include "framework/distributed/nccl/nccl_check.cuh"
#include "framework/distributed/nccl/nccl_ready.cuh"
#include "framework/tensor/cuda/cuda_check.cuh"

namespace cpf::dist::nccl {
namespace {

constexpr auto kWatchdogPeriod = std::chrono::milliseconds(50);

double seconds(std::chrono::milliseconds ms) { return static_cast<double>(ms.count()) / 1000.0; }

}  // namespace

// ---- AbortDomain ----

void AbortDomain::abort(int rank, const std::string& reason) {
  std::vector<std::weak_ptr<NcclRankState>> ranks;
  {
    std::lock_guard lock(mutex_);
    if (aborted_.load(std::memory_order_relaxed)) return;
    failed_rank_ = rank;
    reason_ = reason;
    aborted_.store(true, std::memory_order_release);
    ranks = ranks_;
    arrived_.notify_all();  // ranks meeting at a new_group leave
  }
  for (const auto& weak : ranks) {
    if (auto state = weak.lock()) state->abort_communicators();
  }
}

std::string AbortDomain::reason() const {
  std::lock_guard lock(mutex_);
  if (!aborted_.load(std::memory_order_relaxed)) return "";
  if (failed_rank_ < 0) return reason_;
  return str_cat("rank ", failed_rank_, " failed: ", reason_);
}

void AbortDomain::add(std::weak_ptr<NcclRankState> rank) {
  std::shared_ptr<NcclRankState> late;
  {
    std::lock_guard lock(mutex_);
    if (auto state = rank.lock()) global_ranks_.push_back(state->global_rank());
    ranks_.push_back(rank);
    if (aborted_.load(std::memory_order_relaxed)) late = rank.lock();
  }
  if (late) late->abort_communicators();
}

AbortDomain::NewGroupMeeting AbortDomain::meet_at_new_group(const std::string& group_id, int global_rank, int count,
                                                            int64_t fingerprint, const std::vector<int>& global_ranks,
                                                            std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::unique_lock lock(mutex_);
  std::map<int, Arrival>& group = new_group_arrivals_[group_id];
  group[global_rank] = {count, fingerprint};
  arrived_.notify_all();
  // A rank can be no further than `count` here: the split that ends this new_group needs this rank.
  const auto absent = [&] {
    std::vector<int> out;
    for (int g : global_ranks) {
      const auto it = group.find(g);
      if (it == group.end() || it->second.count < count) out.push_back(g);
    }
    return out;
  };
  NewGroupMeeting meeting;
  while (true) {
    meeting.absent = absent();
    if (meeting.absent.empty() || aborted_.load(std::memory_order_relaxed)) break;
    if (arrived_.wait_until(lock, deadline) == std::cv_status::timeout) {
      meeting.absent = absent();
      break;
    }
  }
  if (meeting.absent.empty()) {
    for (int g : global_ranks) meeting.fingerprints[g] = group[g].fingerprint;
  }
  return meeting;
}

std::vector<int> AbortDomain::not_in_this_process(const std::vector<int>& global_ranks) const {
  std::lock_guard lock(mutex_);
  std::vector<int> out;
  for (int g : global_ranks) {
    if (std::find(global_ranks_.begin(), global_ranks_.end(), g) == global_ranks_.end()) out.push_back(g);
  }
  return out;
}

// ---- NcclRankState ----

std::shared_ptr<NcclRankState> NcclRankState::create(int device, int global_rank, int world_size,
                                                     std::chrono::milliseconds timeout,
                                                     std::shared_ptr<AbortDomain> domain) {
  CPF_CHECK(timeout.count() > 0, "nccl: the timeout must be positive, got ", timeout.count(), " ms");
  std::shared_ptr<NcclRankState> state(new NcclRankState(device, global_rank, world_size, timeout, std::move(domain)));
  state->domain_->add(state);
  state->watchdog_ = std::thread(&NcclRankState::watchdog_loop, std::weak_ptr<NcclRankState>(state));
  return state;
}

NcclRankState::NcclRankState(int device, int global_rank, int world_size, std::chrono::milliseconds timeout,
                             std::shared_ptr<AbortDomain> domain)
    : device_(device),
      global_rank_(global_rank),
      world_size_(world_size),
      timeout_(timeout),
      domain_(domain ? std::move(domain) : std::make_shared<AbortDomain>()),
      events_(std::make_shared<EventPool>(device)) {}

NcclRankState::~NcclRankState() {
  if (watchdog_.joinable()) {
    // The watchdog may drop the last reference itself (through the last Work it looked at).
    if (watchdog_.get_id() == std::this_thread::get_id()) {
      watchdog_.detach();
    } else {
      watchdog_.join();
    }
  }
  // Every group of this rank is gone, so it issues nothing more: its communicators go now, children
  // before parents (see add_communicator for why not when each group's handle went). Nothing else
  // reaches this state any more (the domain holds it weakly), so no lock is needed.
  QuietDeviceGuard guard(device_);
  for (auto it = comms_.rbegin(); it != comms_.rend(); ++it) {
    // exchange: an aborted communicator was freed by its abort already. One with a launch still
    // pending (only where finishing it failed, which aborted the world) is aborted, not destroyed.
    if (!(*it)->aborted.exchange(true))
      (void)((*it)->pending ? ncclCommAbort((*it)->comm) : ncclCommDestroy((*it)->comm));
    (*it)->pending.reset();
  }
}

void NcclRankState::check_alive(const std::string& context) const {
  if (!domain_->aborted()) return;
  CPF_FAIL(context, ": the NCCL world was aborted (", domain_->reason(), ")");
}

std::shared_ptr<Communicator> NcclRankState::add_communicator(ncclComm_t comm, const std::string& group) {
  auto handle = std::make_shared<Communicator>();
  handle->comm = comm;
  handle->group = group;
  bool abort_now = false;
  {
    std::lock_guard lock(mutex_);
    comms_.push_back(handle);
    abort_now = domain_->aborted();
  }
  if (abort_now) abort_communicators();
  return handle;
}

void NcclRankState::abort_communicators() {
  {
    std::lock_guard lock(mutex_);
    QuietDeviceGuard guard(device_);
    for (const auto& c : comms_) {
      if (!c->aborted.exchange(true)) (void)ncclCommAbort(c->comm);
      c->pending.reset();  // its event is never recorded: every wait for it throws the abort's reason
    }
  }
}

void NcclRankState::track(InFlight op) {
  std::lock_guard lock(mutex_);
  in_flight_.push_back(std::move(op));
}

std::string NcclRankState::poll_async_errors() {
  // Under the lock: no communicator is destroyed or aborted while it is asked.
  std::lock_guard lock(mutex_);
  for (const auto& c : comms_) {
    if (c->aborted.load()) continue;
    ncclResult_t async = ncclSuccess;
    const ncclResult_t status = ncclCommGetAsyncError(c->comm, &async);
    if (status != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
      const ncclResult_t shown = status != ncclSuccess ? status : async;
      const char* last = ncclGetLastError(c->comm);
      return str_cat("NCCL reported an asynchronous error on group '", c->group, "': ", ncclGetErrorString(shown),
                     last && *last ? ": " : "", last ? last : "", " (a peer rank may have died)");
    }
    // A launch left pending (run_deferred) that is done now: record its completion, so an operation
    // whose Work waits late (or never) is not aged into the timeout.
    if (async == ncclSuccess && c->pending) {
      std::string failed = record_pending_locked(*c);
      if (!failed.empty()) return failed;
    }
  }
  return "";
}

void NcclRankState::watchdog_loop(std::weak_ptr<NcclRankState> weak) {
  bool device_set = false;
  while (true) {
    std::this_thread::sleep_for(kWatchdogPeriod);
    std::shared_ptr<NcclRankState> self = weak.lock();
    if (!self) return;
    if (!device_set) {
      cudaSetDevice(self->device_);
      device_set = true;
    }
    if (!self->domain_->aborted()) self->watch_once();
    // Releasing `self` may run the destructor on this thread (it then detaches the thread): nothing
    // touches the state after this point.
  }
}

void NcclRankState::watch_once() {
  std::string reason;
  // Finished events are released after the lock (destroying one is a CUDA call).
  std::vector<std::shared_ptr<CompletionEvent>> finished;
  {
    std::lock_guard lock(mutex_);
    const auto now = std::chrono::steady_clock::now();
    std::vector<InFlight> still;
    for (InFlight& op : in_flight_) {
      const cudaError_t q = op.done->recorded() ? cudaEventQuery(op.done->get()) : cudaErrorNotReady;
      if (q == cudaSuccess) {
        finished.push_back(std::move(op.done));
        continue;
      }
      if (q != cudaErrorNotReady && reason.empty()) {
        reason = str_cat(op.done->description(), " failed on the device: ", cudaGetErrorString(q));
      } else if (q == cudaErrorNotReady && now - op.issued > timeout_ && reason.empty()) {
        reason = str_cat(op.done->description(), " did not complete within the timeout of ", seconds(timeout_),
                         " s: a peer rank died, hangs, or issued different operations");
      }
      still.push_back(std::move(op));
    }
    in_flight_ = std::move(still);
  }
  finished.clear();
  if (reason.empty()) reason = poll_async_errors();
  if (!reason.empty()) domain_->abort(global_rank_, reason);
}

void NcclRankState::run(Communicator& comm, std::string_view call, FunctionRef<ncclResult_t()> calls,
                        const std::string& context, const StallCause& stall_cause) {
  finish_launch(comm);  // NCCL allows no call on a communicator not ready yet
  ncclResult_t status = ncclSuccess;
  bool was_aborted = false;
  {
    std::lock_guard lock(mutex_);
    was_aborted = comm.aborted.load();
    if (!was_aborted) status = calls();
  }
  if (was_aborted) CPF_FAIL(context, ": the NCCL world was aborted (", domain_->reason(), ")");
  fail_on_call_error(status, context, call);
  // Also after ncclSuccess: ncclCommSplit returns it while the split still runs.
  wait_ready(comm, context, call, stall_cause);
}

void NcclRankState::wait_ready(Communicator& comm, const std::string& context, std::string_view call,
                               const StallCause& stall_cause) {
  const auto start = std::chrono::steady_clock::now();
  PollPause pause;
  while (true) {
    ncclResult_t state = ncclInProgress;
    bool was_aborted = false;
    std::string last_error;
    {
      std::lock_guard lock(mutex_);
      was_aborted = comm.aborted.load();
      if (!was_aborted) {
        const ncclResult_t asked = ncclCommGetAsyncError(comm.comm, &state);
        if (asked != ncclSuccess) state = asked;
        if (nccl_failed(state)) {
          const char* last = ncclGetLastError(comm.comm);
          if (last && *last) last_error = str_cat(": ", last);
        }
      }
    }
    std::string reason;
    if (was_aborted || domain_->aborted()) {
      // Aborted elsewhere: make sure this rank's communicators are aborted (NCCL's thread joined)
      // before the caller's state goes away.
      abort_communicators();
      CPF_FAIL(context, ": the NCCL world was aborted (", domain_->reason(), ")");
    }
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      reason =
          str_cat(context, ": ", call, " failed: ", ncclGetErrorString(state), " (ncclResult ", static_cast<int>(state),
                  ")", last_error, " (a peer rank may have died or be unreachable; NCCL_DEBUG=WARN tells more)");
    } else if (std::chrono::steady_clock::now() - start > timeout_) {
      reason = str_cat(context, ": ", call, " did not complete within the timeout of ", seconds(timeout_),
                       " s: ", stall_cause());
    }
    if (!reason.empty()) {
      abort(reason);
      abort_communicators();  // when another abort came first, ours did nothing: settle it here
      CPF_FAIL(reason);
    }
    pause();
  }
}

void NcclRankState::host_wait(cudaEvent_t event, const std::string& context, const StallCause& stall_cause) {
  const auto start = std::chrono::steady_clock::now();
  auto pause = std::chrono::microseconds(20);
  while (true) {
    const cudaError_t q = cudaEventQuery(event);
    if (q == cudaSuccess) return;
    check_alive(context);
    CPF_CHECK(q == cudaErrorNotReady, context, ": the device reported ", cudaGetErrorName(q), ": ",
              cudaGetErrorString(q));
    if (std::chrono::steady_clock::now() - start > timeout_) {
      const std::string reason =
          str_cat(context, " did not complete within the timeout of ", seconds(timeout_), " s: ", stall_cause());
      abort(reason);
      CPF_FAIL(reason);
    }
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::microseconds(1000));
  }
}

}  // namespace cpf::dist::nccl

namespace cpf::dist::nccl {

EventPool::~EventPool() {
  QuietDeviceGuard guard(device_);
  for (cudaEvent_t e : free_) (void)cudaEventDestroy(e);
}

cudaEvent_t EventPool::acquire() {
  {
    std::lock_guard lock(mutex_);
    if (!free_.empty()) {
      cudaEvent_t e = free_.back();
      free_.pop_back();
      return e;
    }
  }
  cudaEvent_t e = nullptr;
  CPF_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

void EventPool::release(cudaEvent_t event) {
  if (event == nullptr) return;
  {
    std::lock_guard lock(mutex_);
    if (free_.size() < kKept) {
      free_.push_back(event);
      return;
    }
  }
  QuietDeviceGuard guard(device_);
  (void)cudaEventDestroy(event);
}

CompletionEvent::CompletionEvent(std::shared_ptr<EventPool> pool, std::string description)
    : pool_(std::move(pool)), description_(std::move(description)), event_(pool_->acquire()) {}

CompletionEvent::~CompletionEvent() { pool_->release(event_); }

void CompletionEvent::record(cudaStream_t stream) {
  const cudaError_t status = cudaEventRecord(event_, stream);
  recorded_.store(true, std::memory_order_release);  // even on failure: nothing is left to wait for
  CPF_CUDA_CHECK(status);
}

}  // namespace cpf::dist::nccl
