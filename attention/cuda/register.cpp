// Registers the CUDA attention kernels when cpf_attention_cuda is linked (see CMakeLists.txt: the
// link option --undefined=cpf_attention_cuda_register keeps this object and its initialiser).
// Registering touches no CUDA API, so it is harmless on machines without a GPU.
#include "attention/attention_backend.h"
#include "attention/cp/lse_merge.h"
#include "attention/cuda/attention_cuda.h"
#include "attention/cuda/decode_attention_cuda.h"
#include "attention/cuda/lse_merge_cuda.h"

extern "C" void cpf_attention_cuda_register() {
  cpf::raw::register_device_attention(
      cpf::DeviceType::cuda, {.forward = &cpf::attention_cuda::forward, .backward = &cpf::attention_cuda::backward});
  // The CP ring's running (out, lse) merge (attention/cp/lse_merge.h): one kernel per part.
  cpf::cp::register_device_merge(cpf::DeviceType::cuda, &cpf::attention_cuda::lse_merge);
  // The ring backward's dQ accumulation: a bf16 tile added into the fp32 sum without a converted copy.
  cpf::cp::register_device_accumulate(cpf::DeviceType::cuda, &cpf::attention_cuda::accumulate);
  // Decoding: one query per sequence against its KV cache slot, lengths read on the device.
  cpf::raw::register_device_decode_attention(cpf::DeviceType::cuda, &cpf::attention_cuda::decode_attention);
}

namespace {
const bool g_registered = (cpf_attention_cuda_register(), true);
}  // namespace
