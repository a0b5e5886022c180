#include "framework/distributed/nccl/nccl_check.cuh"

#include <cstdlib>

namespace cpf::dist::nccl {

void throw_nccl_error(const char* file, int line, const char* call, ncclResult_t status, ncclComm_t comm,
                      const std::string& context) {
  const char* last = ncclGetLastError(comm);
  std::string hint;
  if (status == ncclSystemError || status == ncclRemoteError) {
    hint = " (a peer rank may have died or its network is unreachable; NCCL_DEBUG=WARN tells more)";
  }
  throw Error(file, line, call,
              str_cat(context, ": ", call, " failed: ", ncclGetErrorString(status), " (ncclResult ",
                      static_cast<int>(status), ")", last && *last ? ": " : "", last ? last : "", hint));
}

ncclDataType_t nccl_dtype(DType dtype) {
  switch (dtype) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::bf16: return ncclBfloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::boolean: return ncclUint8;
    case DType::f8e4m3:
    case DType::f8e5m2: break;  // the FP8 recipes reduce f32 amaxes, never FP8 data
  }
  CPF_CHECK(false, "nccl: dtype ", dtype, " has no NCCL element type");
  return ncclFloat32;
}

void default_nvls_off() {
  ::setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  // Connect every peer while the world is created (all ranks are there), not lazily inside the first
  // collective, where a missing peer would block the host inside an NCCL call.
  ::setenv("NCCL_RUNTIME_CONNECT", "0", /*overwrite=*/0);
  // NCCL_COMM_BLOCKING overrides ncclConfig_t::blocking: with 1, NCCL calls would block inside the
  // rank's lock, out of reach of every timeout here (nccl_ready.cuh).
  const char* blocking = std::getenv("NCCL_COMM_BLOCKING");
  CPF_CHECK(blocking == nullptr || std::string(blocking) == "0", "nccl: NCCL_COMM_BLOCKING=", blocking,
            " makes NCCL calls block, which this backend's bounded waits cannot interrupt; unset it (the backend "
            "creates non-blocking communicators and bounds every wait itself)");
}

ncclRedOp_t nccl_reduce_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclAvg;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
  }
  return ncclSum;
}

}  // namespace cpf::dist::nccl
