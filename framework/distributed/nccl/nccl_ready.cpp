#include "framework/distributed/nccl/nccl_ready.cuh"

#include <algorithm>

#include "framework/core/error.h"
#include "framework/distributed/nccl/nccl_check.cuh"

namespace cpf::dist::nccl {

ncclConfig_t nonblocking_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

ncclResult_t in_group(FunctionRef<ncclResult_t()> post) {
  const ncclResult_t start = ncclGroupStart();
  if (nccl_failed(start)) return start;
  ncclResult_t posted = ncclSuccess;
  try {
    posted = post();
  } catch (...) {
    (void)ncclGroupEnd();  // close the group before the error leaves (what was posted is launched or dropped)
    throw;
  }
  const ncclResult_t end = ncclGroupEnd();
  return nccl_failed(posted) ? posted : end;
}

ncclComm_t create_communicator(int world_size, const ncclUniqueId& id, int rank, std::chrono::milliseconds timeout,
                               const AbortDomain& domain, const std::string& what, const CreationWatch& watch) {
  CPF_CHECK(timeout.count() > 0, what, ": the timeout must be positive, got ", timeout.count(), " ms");
  ncclConfig_t config = nonblocking_config();
  ncclComm_t comm = nullptr;
  const ncclResult_t started = ncclCommInitRankConfig(&comm, world_size, id, rank, &config);
  if (nccl_failed(started)) {
    // A communicator handed back with the failure is released; ncclCommAbort(nullptr) does nothing.
    (void)ncclCommAbort(comm);
    throw_nccl_error(__FILE__, __LINE__, "ncclCommInitRankConfig", started, nullptr, what);
  }
  CPF_CHECK(comm != nullptr, what, ": ncclCommInitRankConfig returned ", ncclGetErrorString(started),
            " but no communicator");
  const auto start = std::chrono::steady_clock::now();
  PollPause pause;
  while (true) {
    ncclResult_t state = ncclInProgress;
    const ncclResult_t asked = ncclCommGetAsyncError(comm, &state);
    if (asked != ncclSuccess) state = asked;
    if (state == ncclSuccess) return comm;
    if (state != ncclInProgress) {
      const char* last = ncclGetLastError(comm);
      const std::string last_text = last && *last ? str_cat(": ", last) : "";
      (void)ncclCommAbort(comm);
      CPF_FAIL(what, " failed: ", ncclGetErrorString(state), " (ncclResult ", static_cast<int>(state), ")", last_text,
               " (a peer rank may have died or be unreachable; NCCL_DEBUG=WARN tells more)");
    }
    if (domain.aborted()) {
      (void)ncclCommAbort(comm);  // stops NCCL's thread, which waits for the ranks that will not come
      CPF_FAIL(what, " stopped: the NCCL world was aborted (", domain.reason(), ")");
    }
    const auto waited = std::chrono::steady_clock::now() - start;
    if (waited > timeout) {
      const std::string absent = watch.absent ? watch.absent() : "";
      const std::chrono::milliseconds bound = absent.empty() ? std::max(timeout, kCreationFloor) : timeout;
      if (waited > bound) {
        (void)ncclCommAbort(comm);
        CPF_FAIL(what, " did not complete within the timeout of ", static_cast<double>(bound.count()) / 1000.0,
                 " s: ", absent.empty() ? watch.stalled : absent);
      }
    }
    pause();
  }
}

}  // namespace cpf::dist::nccl
