#pragma once
// decode_attention: one new query per sequence against its KV cache slot, with the lengths read from a
// tensor (on the device), so one captured CUDA graph serves every decoding step.
//
//   q       (S, H, D_qk)              the newest token of each of S sequences
//   keys    (S * capacity, H_kv, D_qk) sequence n's tokens in rows [n * capacity, n * capacity + len_n)
//   values  (S * capacity, H_kv, D_v)  (attention/nn/kv_cache.h lays the cache out this way)
//   lengths (S) i32/i64               len_n: tokens in slot n, the new one included (0 <= len_n <= capacity)
//   out     (S, H, D_v) in q's dtype
//
// The query of sequence n sits at position len_n - 1 and sees the keys at positions 0 .. len_n - 1 (the
// causal mask), or only the last window.left + 1 of them (a sliding window). That is exactly what
// dot_product_attention computes for the new token of a thd KVCacheStep with one new token per sequence
// (the tests compare the two), but dot_product_attention takes its lengths as host tables, which a graph
// would freeze at their captured values. A sequence with len_n = 0 gets zeros (as a row that sees no key).
// spec.sink joins every denominator (attention_sink.h). GQA: query head h reads kv head h / (H / H_kv).
//
// Softmax and the weighted sum in f32 (f64 for f64 inputs). Not differentiable (decoding runs without
// gradients): inputs that require grad are refused while grad mode is on.
#include <cstdint>

#include "attention/spec.h"
#include "framework/tensor/tensor.h"

namespace cpf {

// The largest head dim (D_qk and D_v) the device kernel holds in registers (the CPU has no limit); a
// decoder for wider heads keeps the general kernels (models/gpt_decoder.h).
inline constexpr int64_t kDecodeAttentionMaxHeadDim = 640;

// spec: a causal mask (causal or padding_causal: the lengths are the padding; thd format), its window,
// scale, head counts and sink as for the full forward. Lengths outside [0, capacity] are refused on the
// CPU; on a device they are checked by the device (an error at the next synchronisation) and never read
// outside the slot. q may be strided (its last dim contiguous), as a view of a fused QKV projection is.
Tensor decode_attention(const Tensor& q, const Tensor& keys, const Tensor& values, const Tensor& lengths,
                        const AttentionSpec& spec);

// The decoding step of a KV cache in one call: first writes the new token's key and value, k_new and
// v_new (S, H_kv, D_qk) / (S, H_kv, D_v) (strided views allowed), into row n * capacity + len_n - 1 of
// `keys` / `values` (a sequence with len_n = 0 writes nothing), then returns decode_attention. On a device
// this is one kernel (the new row is read from k_new / v_new while it is being stored). check_lengths =
// false skips the device's range check of the lengths, for a caller that checked these very lengths
// already (every layer of a model shares them); the kernel never touches memory outside the slots.
Tensor decode_attention_append(const Tensor& q, const Tensor& k_new, const Tensor& v_new, const Tensor& keys,
                               const Tensor& values, const Tensor& lengths, const AttentionSpec& spec,
                               bool check_lengths = true);

namespace raw {

// What the device kernel needs beyond the tensors (validated by decode_attention).
struct DecodeAttentionParams {
  int64_t capacity = 0;      // rows of each sequence's slot
  double scale = 1.0;        // softmax scale
  int64_t window_left = -1;  // -1: every earlier key; else at most this many keys before the query
  Tensor sink;               // (H) f32 (f64 for f64 inputs), or undefined
  Tensor k_new, v_new;       // decode_attention_append's new rows (S, H_kv, D), or undefined
};

// Registered by the device attention library (attention_backend.h): out (S, H, D_v) contiguous of q's
// dtype; q, k_new, v_new with a contiguous last dim (other strides free); keys, values contiguous (written
// at the new rows when k_new is defined); lengths contiguous i32/i64.
using DeviceDecodeAttention = void (*)(const Tensor& out, const Tensor& q, const Tensor& keys, const Tensor& values,
                                       const Tensor& lengths, const DecodeAttentionParams& params);
void register_device_decode_attention(DeviceType type, DeviceDecodeAttention kernel);

}  // namespace raw
}  // namespace cpf
