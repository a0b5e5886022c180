#pragma once
// The decoding attention kernel (attention/decode_attention.h) with plain parameters; the glue
// (decode_attention_cuda.cpp) turns tensors into pointers.
#include <cuda_runtime.h>

#include <cstdint>

namespace cpf::attention_cuda::decode {

// The largest head dim (D_qk and D_v) the kernel holds in registers: 32 lanes x kMaxPerLane values.
constexpr int kMaxHeadDim = 640;  // kDecodeAttentionMaxHeadDim (attention/decode_attention.h)

struct DecodeLaunch {
  int dtype = 0;                  // cpf::DType code of out, q, keys, values: 0 f32, 1 f64, 2 bf16
  int length_dtype = 3;           // 3 i32, 4 i64
  void* out = nullptr;            // (S, H, D_v)
  const void* q = nullptr;        // (S, H, D_qk)
  void* keys = nullptr;           // (S * capacity, H_kv, D_qk); written at the new rows when appending
  void* values = nullptr;         // (S * capacity, H_kv, D_v)
  const void* lengths = nullptr;  // (S)
  const void* sink = nullptr;     // (H) f32 (f64 for f64), or null
  const void* k_new = nullptr;    // (S, H_kv, D_qk) rows to append at n * capacity + len_n - 1, or null
  const void* v_new = nullptr;    // (S, H_kv, D_v)
  int64_t q_stride[2] = {0, 0};   // element strides of q's dims 0 and 1 (the last dim is contiguous)
  int64_t k_new_stride[2] = {0, 0}, v_new_stride[2] = {0, 0};
  int64_t seqs = 0, heads = 0, kv_heads = 0, dim_qk = 0, dim_v = 0, capacity = 0, window_left = -1;
  double scale = 1.0;
  int splits = 1;            // blocks per (sequence, head), each over its share of the positions
  void* partials = nullptr;  // (S, H, splits, D_v + 2) in the compute type (f32; f64 for f64) when splits > 1
};

// The largest number of position splits (decode_splits).
constexpr int kMaxSplits = 16;

// How many blocks share one (sequence, head)'s positions: enough to give every SM about two blocks when
// S x H alone would leave most of them idle (GPT-2's 12 heads at batch 1 on 132 SMs), each split at least
// 32 positions of the slot's capacity. A function of the shapes only, so one captured graph serves every
// length; 1 takes the one-kernel path.
int decode_splits(int64_t seqs, int64_t heads, int64_t capacity, int sm_count);

void launch_decode_attention(const DecodeLaunch& a, cudaStream_t stream);

}  // namespace cpf::attention_cuda::decode
