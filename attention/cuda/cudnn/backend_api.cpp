#include "attention/cuda/cudnn/backend_api.h"

#include <array>

#include "framework/tensor/cuda/runtime.cuh"

namespace cpf::attention_cuda::cudnn {

std::string last_error_string() {
  char message[1024] = {0};
  cudnnGetLastErrorString(message, sizeof message);
  return message;
}

void throw_cudnn_error(const char* call, cudnnStatus_t status) {
  const std::string last = last_error_string();
  CPF_FAIL("cuDNN error in ", call, ": ", cudnnGetErrorString(status), last.empty() ? "" : " | ", last);
}

Descriptor::Descriptor(cudnnBackendDescriptorType_t type) {
  CPF_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &desc_));
}

Descriptor::~Descriptor() {
  if (desc_ != nullptr) cudnnBackendDestroyDescriptor(desc_);
}

namespace {

// Handles of this thread, one per device. Destroyed at thread exit; the status is ignored there
// because at process exit the CUDA context may already be gone.
struct ThreadHandles {
  std::array<cudnnHandle_t, cuda::kMaxDevices> handles{};
  ~ThreadHandles() {
    for (cudnnHandle_t h : handles) {
      if (h != nullptr) cudnnDestroy(h);
    }
  }
};

void set_attr(Desc d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
              const void* value, const char* what) {
  const cudnnStatus_t status = cudnnBackendSetAttribute(d, name, type, count, value);
  if (status != CUDNN_STATUS_SUCCESS) throw_cudnn_error(what, status);
}

void set_desc(Desc d, cudnnBackendAttributeName_t name, Desc value, const char* what) {
  set_attr(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value, what);
}

void finalize(Desc d, const char* what) {
  const cudnnStatus_t status = cudnnBackendFinalize(d);
  if (status != CUDNN_STATUS_SUCCESS) throw_cudnn_error(what, status);
}

}  // namespace

cudnnHandle_t handle_for(int device) {
  cuda::check_device_index(device);
  thread_local ThreadHandles thread_handles;
  cudnnHandle_t& h = thread_handles.handles[static_cast<size_t>(device)];
  if (h == nullptr) {
    cuda::DeviceGuard guard(device);
    CPF_CUDNN_CHECK(cudnnCreate(&h));
  }
  // The current stream may change between calls (rank threads set their own).
  CPF_CUDNN_CHECK(cudnnSetStream(h, cuda::current_cuda_stream(device)));
  return h;
}

Desc GraphBuilder::make(cudnnBackendDescriptorType_t type) {
  descriptors_.emplace_back(type);
  return descriptors_.back().get();
}

Desc GraphBuilder::tensor(int64_t uid, cudnnDataType_t type, const Dims& dims, const Dims& strides,
                          TensorFlags options) {
  CPF_CHECK(dims.size() == strides.size(), "cudnn graph: tensor dims ", dims, " and strides ", strides,
            " differ in rank");
  Desc t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  if (uid < 0) uid = next_virtual_uid_++;
  const int64_t alignment = 16;
  const bool yes = true;
  set_attr(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, "tensor data type");
  set_attr(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, static_cast<int64_t>(dims.size()), dims.data(),
           "tensor dimensions");
  set_attr(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, static_cast<int64_t>(strides.size()), strides.data(),
           "tensor strides");
  set_attr(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor uid");
  set_attr(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment, "tensor alignment");
  if (options.is_virtual) set_attr(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes, "tensor virtual");
  if (options.by_value) set_attr(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes, "tensor by value");
  if (options.ragged != nullptr) set_desc(t, CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC, options.ragged, "ragged offset");
  finalize(t, "cudnnBackendFinalize(tensor)");
  return t;
}

Desc GraphBuilder::virtual_tensor(cudnnDataType_t type, const Dims& dims, const Dims& strides) {
  return tensor(-1, type, dims, strides, {.is_virtual = true});
}

Desc GraphBuilder::scalar(int64_t uid, cudnnDataType_t type) {
  return tensor(uid, type, {1, 1, 1, 1}, {1, 1, 1, 1}, {.by_value = true});
}

Desc GraphBuilder::pointwise(cudnnPointwiseMode_t mode, Desc x, Desc b, Desc t, Desc y, cudnnDataType_t precision,
                             int64_t axis) {
  Desc pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  set_attr(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
  set_attr(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &precision, "pointwise precision");
  if (axis >= 0) set_attr(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "pointwise axis");
  finalize(pw, "cudnnBackendFinalize(pointwise descriptor)");

  Desc op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  const float one = 1.0f;
  set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw, "pointwise op descriptor");
  set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, "pointwise x");
  if (b != nullptr) set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b, "pointwise b");
  if (t != nullptr) set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t, "pointwise t");
  set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, "pointwise y");
  set_attr(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one, "pointwise alpha1");
  set_attr(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one, "pointwise alpha2");
  finalize(op, "cudnnBackendFinalize(pointwise op)");
  ops_.push_back(op);
  return y;
}

void GraphBuilder::matmul(Desc a, Desc b, Desc c, Desc m_override, Desc n_override, Desc k_override) {
  Desc mm = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  set_attr(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute, "matmul compute type");
  finalize(mm, "cudnnBackendFinalize(matmul descriptor)");

  Desc op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
  set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a, "matmul a");
  set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b, "matmul b");
  set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c, "matmul c");
  set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm, "matmul descriptor");
  if (m_override != nullptr) set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, m_override, "matmul M");
  if (n_override != nullptr) set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, n_override, "matmul N");
  if (k_override != nullptr) set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, k_override, "matmul K");
  finalize(op, "cudnnBackendFinalize(matmul op)");
  ops_.push_back(op);
}

void GraphBuilder::reduction(cudnnReduceTensorOp_t reduce, Desc x, Desc y) {
  Desc rd = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  set_attr(rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &reduce, "reduction operator");
  set_attr(rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute, "reduction compute type");
  finalize(rd, "cudnnBackendFinalize(reduction descriptor)");

  Desc op = make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
  set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, rd, "reduction descriptor");
  set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x, "reduction x");
  set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y, "reduction y");
  finalize(op, "cudnnBackendFinalize(reduction op)");
  ops_.push_back(op);
}

void GraphBuilder::reshape(Desc x, Desc y) {
  Desc op = make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
  set_desc(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x, "reshape x");
  set_desc(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y, "reshape y");
  finalize(op, "cudnnBackendFinalize(reshape op)");
  ops_.push_back(op);
}

std::unique_ptr<ExecutionPlan> GraphBuilder::finish(cudnnHandle_t handle, std::string* failure) {
  Desc graph = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  set_attr(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(ops_.size()),
           ops_.data(), "operation graph ops");
  set_attr(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "operation graph handle");
  if (const cudnnStatus_t s = cudnnBackendFinalize(graph); s != CUDNN_STATUS_SUCCESS) {
    *failure =
        std::string("the operation graph does not finalize: ") + cudnnGetErrorString(s) + ": " + last_error_string();
    return nullptr;
  }
  std::string last_failure = "heuristics returned no engine configuration";
  for (const cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    Desc heur = make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    set_desc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph, "heuristics graph");
    set_attr(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics mode");
    if (const cudnnStatus_t s = cudnnBackendFinalize(heur); s != CUDNN_STATUS_SUCCESS) {
      last_failure = std::string("heuristics failed: ") + cudnnGetErrorString(s) + ": " + last_error_string();
      continue;
    }
    int64_t count = 0;
    CPF_CUDNN_CHECK(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                             &count, nullptr));
    std::vector<Desc> configs;
    for (int64_t i = 0; i < count; ++i) configs.push_back(make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
    int64_t returned = 0;
    if (count > 0) {
      CPF_CUDNN_CHECK(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                               count, &returned, configs.data()));
    }
    for (int64_t i = 0; i < returned; ++i) {
      Descriptor plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      set_attr(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "plan handle");
      set_desc(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, configs[static_cast<size_t>(i)], "plan config");
      if (const cudnnStatus_t s = cudnnBackendFinalize(plan.get()); s != CUDNN_STATUS_SUCCESS) {
        last_failure =
            std::string("no engine configuration finalizes: ") + cudnnGetErrorString(s) + ": " + last_error_string();
        continue;
      }
      auto result = std::make_unique<ExecutionPlan>();
      int64_t got = 0;
      CPF_CUDNN_CHECK(cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64,
                                               1, &got, &result->workspace_bytes));
      char json[512] = {0};
      if (cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
                                   sizeof json - 1, &got, json) == CUDNN_STATUS_SUCCESS) {
        result->engine = json;
      }
      result->plan = plan.get();
      result->descriptors = std::move(descriptors_);
      result->descriptors.push_back(std::move(plan));
      return result;
    }
  }
  *failure = last_failure;
  return nullptr;
}

void execute(cudnnHandle_t handle, const ExecutionPlan& plan, const std::vector<int64_t>& uids,
             const std::vector<void*>& pointers, void* workspace) {
  CPF_CHECK(uids.size() == pointers.size(), "cudnn execute: ", uids.size(), " uids but ", pointers.size(), " pointers");
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  const auto n = static_cast<int64_t>(uids.size());
  CPF_CUDNN_CHECK(
      cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids.data()));
  CPF_CUDNN_CHECK(cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n,
                                           pointers.data()));
  CPF_CUDNN_CHECK(
      cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace));
  CPF_CUDNN_CHECK(cudnnBackendFinalize(pack.get()));
  CPF_CUDNN_CHECK(cudnnBackendExecute(handle, plan.plan, pack.get()));
}

}  // namespace cpf::attention_cuda::cudnn
