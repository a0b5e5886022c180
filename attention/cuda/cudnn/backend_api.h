#pragma once
// Thin C++ layer over cuDNN's backend (graph) API, private to cpf_attention_cuda: status checks,
// owned descriptors, the per-(device, thread) handle, a graph builder for the ops fused attention
// needs (tensor, pointwise, matmul, reduction, reshape) and execution plans chosen by cuDNN's
// heuristics. Nothing here knows about attention; attention/cuda/cudnn/graph_building.cpp builds the SDPA graphs on it.
#include <cudnn.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "framework/core/error.h"

namespace cpf::attention_cuda::cudnn {

// cuDNN's last error message ("" when none), for reasons and error messages.
std::string last_error_string();
[[noreturn]] void throw_cudnn_error(const char* call, cudnnStatus_t status);

}  // namespace cpf::attention_cuda::cudnn

// Throws cpf::Error naming the call, cudnnGetErrorString and cudnnGetLastErrorString.
#define CPF_CUDNN_CHECK(call)                                                    \
  do {                                                                           \
    const cudnnStatus_t cpf_cudnn_status_ = (call);                              \
    if (cpf_cudnn_status_ != CUDNN_STATUS_SUCCESS) [[unlikely]] {                \
      ::cpf::attention_cuda::cudnn::throw_cudnn_error(#call, cpf_cudnn_status_); \
    }                                                                            \
  } while (0)

namespace cpf::attention_cuda::cudnn {

// An owned cudnnBackendDescriptor_t (destroyed with the object).
class Descriptor {
 public:
  explicit Descriptor(cudnnBackendDescriptorType_t type);
  ~Descriptor();
  Descriptor(Descriptor&& other) noexcept : desc_(other.desc_) { other.desc_ = nullptr; }
  Descriptor& operator=(Descriptor&&) = delete;
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  cudnnBackendDescriptor_t get() const { return desc_; }

 private:
  cudnnBackendDescriptor_t desc_ = nullptr;
};

// This thread's handle for `device`, bound to the thread's current stream of that device. Created on
// first use (cudnnCreate needs the device current) and destroyed when the thread exits.
cudnnHandle_t handle_for(int device);

using Dims = std::vector<int64_t>;
using Desc = cudnnBackendDescriptor_t;  // non-owning: the GraphBuilder or ExecutionPlan owns it

// A finalized execution plan plus every descriptor it was built from (kept alive with it).
struct ExecutionPlan {
  std::vector<Descriptor> descriptors;
  Desc plan = nullptr;
  int64_t workspace_bytes = 0;
  std::string engine;  // the plan's JSON (engine name and knobs), for logs
};

// Builds one operation graph. Tensor and op helpers throw cpf::Error (via CPF_CUDNN_CHECK) when cuDNN
// rejects an attribute; finish() returns the first plan cuDNN's heuristics offer that finalizes.
struct TensorFlags {
  bool is_virtual = false;
  bool by_value = false;  // a host scalar passed in the variant pack
  Desc ragged = nullptr;  // ragged-offset tensor (thd)
};

class GraphBuilder {
 public:
  // A tensor with an explicit uid (inputs, outputs, scalars) or a fresh one (uid < 0).
  Desc tensor(int64_t uid, cudnnDataType_t type, const Dims& dims, const Dims& strides, TensorFlags options = {});
  Desc virtual_tensor(cudnnDataType_t type, const Dims& dims, const Dims& strides);
  Desc scalar(int64_t uid, cudnnDataType_t type);  // by-value [1,1,1,1]

  // y = op(x[, b][, t]); returns y. `axis` >= 0 only for GEN_INDEX.
  Desc pointwise(cudnnPointwiseMode_t mode, Desc x, Desc b, Desc t, Desc y, cudnnDataType_t precision,
                 int64_t axis = -1);
  // c = a @ b with optional M/N/K overrides (per-batch actual lengths).
  void matmul(Desc a, Desc b, Desc c, Desc m_override = nullptr, Desc n_override = nullptr, Desc k_override = nullptr);
  void reduction(cudnnReduceTensorOp_t op, Desc x, Desc y);
  void reshape(Desc x, Desc y);

  // Finalizes the op graph and tries heuristic mode A, then FALLBACK. nullptr when no engine config
  // finalizes; *failure then holds why (cuDNN's last error).
  std::unique_ptr<ExecutionPlan> finish(cudnnHandle_t handle, std::string* failure);

 private:
  Desc make(cudnnBackendDescriptorType_t type);
  std::vector<Descriptor> descriptors_;
  std::vector<Desc> ops_;
  int64_t next_virtual_uid_ = 1000;
};

// One execution: uids and their pointers (device pointers; host pointers for by-value scalars).
void execute(cudnnHandle_t handle, const ExecutionPlan& plan, const std::vector<int64_t>& uids,
             const std::vector<void*>& pointers, void* workspace);

}  // namespace cpf::attention_cuda::cudnn
