#pragma once
// Index errors found on the device, reported on the host later (private to framework/tensor/cuda).
//
// Range checks of index values (embedding ids, cross-entropy targets, index_select / gather /
// scatter / index_add_ indices) run as kernels on the op's stream instead of copying the indices to
// the host: the first offending position of a check (the smallest flat position, as the CPU's
// row-major walk finds it) goes to a per-call slot, and a one-thread kernel then writes the op, the
// value, the position and what the message needs into the device's error record, unless an earlier
// error already holds it (the first failing check wins; later ones are dropped until it is reported).
// The record lives in mapped pinned host memory, so looking at it is a plain host read, no CUDA call.
//
// raise_device_errors(device) turns a recorded error into the cpf::Error the CPU check throws, with
// the same text. It runs where the host waits for the device anyway: every device->host copy (so
// item(), to_vector(), printing), cuda::synchronize, Stream::synchronize, memory_stats, empty_cache;
// and after every kernel launch in the CPF_CUDA_SYNC=1 debug mode. Kernels that use indices skip the
// out-of-range ones (no out-of-bounds access): their results are wrong until the error is raised.
#include <cuda_runtime.h>

#include <cstdint>

namespace cpf::cuda {

// Which of the CPU messages a failed check reproduces.
enum class IndexErrorKind : int32_t {
  index = 0,         // "<op>: index v at position [..] is out of range for dim d of size n (...)"
  embedding_id = 1,  // "<op>: id v at position [..] of ids [..] is out of range for a table of V=n rows (...)"
  target = 2,        // "<op>: target t at row r is out of range for C=n classes (...)"
};

inline constexpr int kIndexCheckMaxDims = 12;

// One check: index (contiguous, numel elements of index_dtype kI32/kI64) must lie in [0, bound), or
// equal ignore when has_ignore. op is a string literal (it must outlive the check: the message is
// built later). shape is the index's shape, for the position in the message.
struct IndexCheck {
  IndexErrorKind kind = IndexErrorKind::index;
  const char* op = "";
  const void* index = nullptr;
  int index_dtype = 0;
  int64_t numel = 0;
  int64_t bound = 0;
  int64_t dim = 0;
  int64_t ignore = 0;
  int has_ignore = 0;
  int ndim = 0;
  int64_t shape[kIndexCheckMaxDims] = {};
};

// Launches the check on `stream` of `device` (current device set by the caller). `slot` is 8 bytes of
// device memory for the per-call minimum position (stream-ordered scratch).
void launch_index_check(const IndexCheck& check, void* slot, int device, int sm_count, cudaStream_t stream);

// Throws the recorded error of `device`, if any, and clears it. Cheap when there is none.
void raise_device_errors(int device);

// The CPF_CUDA_SYNC=1 debug mode: synchronise after each launch (see cuda.h).
bool sync_debug_enabled();
// Called by CPF_CUDA_CHECK_LAUNCH in the debug mode: waits for the current device and throws an
// asynchronous fault or a recorded index error, naming the launch `what`.
void sync_after_launch(const char* what);

}  // namespace cpf::cuda
