#pragma once
// Which kernels run an attention call, and the hook through which a device library provides them.
//
// CPU tensors always run the CPU flash kernels (attention/cpu). CUDA tensors run what
// cpf_attention_cuda registers (attention/cuda): cuDNN's fused flash attention or the unfused CUDA
// path, chosen per call by `AttentionBackend` (config key `attention.backend`, environment override
// CPF_ATTENTION_BACKEND; docs/attention.md). A build without that library reports
//   "attention_forward: no attention kernels for cuda:0 in this build ..."
// Header without CUDA: it only names the entry points.
#include <cstdint>
#include <string_view>

#include "framework/tensor/device.h"
#include "framework/tensor/tensor.h"

namespace cpf {

struct AttentionProblem;

enum class AttentionBackend : uint8_t {
  automatic,  // "auto": cuDNN when its graph builds for the call, else unfused (the reason is logged once)
  cudnn,      // cuDNN fused SDPA; a call it cannot run is an error naming why
  unfused,    // cuBLASLt GEMMs + a masked softmax kernel: everything the CPU reference supports
};

std::string_view attention_backend_name(AttentionBackend backend);  // "auto", "cudnn", "unfused"
// Throws on unknown names, listing the valid ones.
AttentionBackend parse_attention_backend(std::string_view name);

namespace raw {
struct AttentionForward;
struct AttentionGrads;

// Entry points of one device's attention kernels. The caller (raw::attention_forward/backward) has
// validated the inputs into `p`; tensors are on that device in any layout the problem describes.
// Results follow the CPU contract in attention_op.h (out in q's dtype, lse f32 (f64 for f64)).
struct DeviceAttentionKernels {
  AttentionForward (*forward)(const AttentionProblem& p, const Tensor& q, const Tensor& k, const Tensor& v) = nullptr;
  // dlse may be undefined. out/lse are the forward results (or a CP step's merged global ones).
  AttentionGrads (*backward)(const AttentionProblem& p, const Tensor& dout, const Tensor& dlse, const Tensor& q,
                             const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse) = nullptr;
};

// Called once by the device library's static initialiser.
void register_device_attention(DeviceType type, const DeviceAttentionKernels& kernels);
// The kernels for `type`, or nullptr when no library registered them.
const DeviceAttentionKernels* device_attention(DeviceType type);
}  // namespace raw

}  // namespace cpf
