#pragma once
// The CUDA entry of decode_attention (attention/decode_attention.h), registered by register.cpp.
#include "attention/decode_attention.h"

namespace cpf::attention_cuda {

// raw::DeviceDecodeAttention: out (S, H, D_v); head dims up to decode::kMaxHeadDim (640).
void decode_attention(const Tensor& out, const Tensor& q, const Tensor& keys, const Tensor& values,
                      const Tensor& lengths, const raw::DecodeAttentionParams& params);

}  // namespace cpf::attention_cuda
