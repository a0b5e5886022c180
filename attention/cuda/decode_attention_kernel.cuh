#pragma once
// The decoding attention kernel (attention/decode_attention.h) with plain parameters; the glue
// (decode_attention_cuda.cpp) turns tensors into pointers.
#include <cuda_runtime.h>

#include <cstdint>

namespace cpf::attention_cuda::decode {

// The largest head dim (D_qk and D_v) the kernel holds in registers: 32 lanes x kMaxPerLane values.
constexpr int kMaxHeadDim = 640;

struct DecodeLaunch {
  int dtype = 0;                  // cpf::DType code of out, q, keys, values: 0 f32, 1 f64, 2 bf16
  int length_dtype = 3;           // 3 i32, 4 i64
  void* out = nullptr;            // (S, H, D_v)
  const void* q = nullptr;        // (S, H, D_qk)
  const void* keys = nullptr;     // (S * capacity, H_kv, D_qk)
  const void* values = nullptr;   // (S * capacity, H_kv, D_v)
  const void* lengths = nullptr;  // (S)
  const void* sink = nullptr;     // (H) f32 (f64 for f64), or null
  int64_t seqs = 0, heads = 0, kv_heads = 0, dim_qk = 0, dim_v = 0, capacity = 0, window_left = -1;
  double scale = 1.0;
};

void launch_decode_attention(const DecodeLaunch& a, cudaStream_t stream);

}  // namespace cpf::attention_cuda::decode
