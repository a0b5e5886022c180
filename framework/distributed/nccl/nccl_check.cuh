#pragma once
// Status checks and type mappings for NCCL calls (private to framework/distributed/nccl: includes nccl.h).
// A failure throws cpf::Error naming the call, NCCL's error string and its last error text:
//   CPF_NCCL_CHECK(ncclGetUniqueId(&id), nullptr, ctx)
//     -> "launch (nccl backend): ncclGetUniqueId(&id) failed: unhandled system error (...): <last error>"
// Only for calls outside a communicator: calls on one go through NcclRankState::run, which also
// waits until the (non-blocking) communicator is ready again (nccl_ready.cuh).
#include <nccl.h>

#include <string>

#include "framework/core/error.h"
#include "framework/distributed/process_group.h"
#include "framework/tensor/dtype.h"

namespace cpf::dist::nccl {

[[noreturn]] void throw_nccl_error(const char* file, int line, const char* call, ncclResult_t status, ncclComm_t comm,
                                   const std::string& context);

// NCCL's element type for a cpformer dtype; bool travels as uint8 (max = or, min = and on 0/1).
ncclDataType_t nccl_dtype(DType dtype);
ncclRedOp_t nccl_reduce_op(ReduceOp op);

// Sets NCCL_NVLS_ENABLE=0 unless the variable is set: NVLink multicast stays off unless asked for (on
// the shared multi-GPU machines a program using it can take the host's GPUs out of service).
// Also NCCL_RUNTIME_CONNECT=0 unless set: peers connect at world creation. Called before the first
// NCCL call of a world. Rejects NCCL_COMM_BLOCKING other than 0 (it would make the communicators
// blocking, see nccl_ready.cuh).
void default_nvls_off();

}  // namespace cpf::dist::nccl

#define CPF_NCCL_CHECK(call, comm, context)                                                                \
  do {                                                                                                     \
    const ncclResult_t cpf_nccl_status_ = (call);                                                          \
    if (cpf_nccl_status_ != ncclSuccess && cpf_nccl_status_ != ncclInProgress) [[unlikely]] {              \
      ::cpf::dist::nccl::throw_nccl_error(__FILE__, __LINE__, #call, cpf_nccl_status_, (comm), (context)); \
    }                                                                                                      \
  } while (0)
