#pragma once
// Key/value caches for incremental decoding with the attention modules (thd layout).
//
// A batch of S sequences decodes together. Every attention layer owns one KVCache: keys (S * capacity,
// H_kv, D_qk) and values (S * capacity, H_kv, D_v), sequence n's tokens in rows [n * capacity,
// n * capacity + length_n) of its slot. One KVCacheStep, shared by all layers of a forward call, says
// how many tokens each sequence already has there (`past`) and how many this call appends (`new_tokens`,
// packed in sequence order as the call's thd input):
//
//   step  past=[3, 5] new=[1, 1]:  queries = 2 new tokens at positions 3 and 5
//   cache rows:  [a a a A . . | b b b b b B]    (capacity 6; A, B written by this call)
//
// Each new token attends to its sequence's cached tokens and to the new ones up to itself: the mask is
// the module's (causal, sliding window) applied to positions, so a call gives the same rows as the full
// forward over each whole prefix. A prefill is a step with past = 0; a sequence with new = 0 sits the
// call out; a step with past = 0 and new > 0 restarts that sequence (its slot is overwritten).
//
// A decoding step (one new token per sequence) may also carry its tables on the device (KVDecodeTables):
// the modules then read positions and lengths from those tensors (decode_attention_append writes the new
// keys and values and attends in one kernel), never from the host vectors, so a CUDA graph captured once
// replays every later step after the caller rewrites the tables (models/gpt_decoder.h).
#include <cstdint>
#include <vector>

#include "attention/dot_product_attention.h"
#include "attention/sequence_info.h"
#include "framework/tensor/tensor.h"

namespace cpf::nn {

// (S) i64 tensors on the model's device for a step where every sequence gets exactly one new token.
struct KVDecodeTables {
  Tensor positions;  // the new token's position: past_n
  Tensor lengths;    // tokens in the slot after the step: past_n + 1 (the new token's row: n * capacity + past_n)
  // Whether this step's lengths were range-checked on the device already (by the first layer): the
  // others skip the check. The caller resets it whenever it rewrites the tables.
  mutable bool lengths_checked = false;
};

struct KVCacheStep {
  int64_t capacity = 0;             // slot tokens per sequence, the same in every layer's cache
  std::vector<int64_t> past;        // tokens each sequence keeps from earlier calls
  std::vector<int64_t> new_tokens;  // tokens this call appends to each sequence
  // Set: a decoding step whose tables live on the device (new_tokens all 1; past must agree with the
  // tables, which the kernels read instead of the vectors). Not owned.
  const KVDecodeTables* decode = nullptr;

  int64_t num_sequences() const { return static_cast<int64_t>(past.size()); }
  int64_t total_new() const;
  // Throws unless past/new have one entry per sequence, entries >= 0, past + new <= capacity and at
  // least one new token in all.
  void check() const;
  // The attention call: queries are the new tokens packed (positions past_n .. past_n + new_n - 1),
  // keys/values the sequences' slots holding past_n + new_n tokens (positions 0 ..).
  SequenceInfo attention_info() const;
  // The position of every new token, in input order (RoPE and learned position tables).
  std::vector<int64_t> positions() const;
  // The same as a (T_new) i64 tensor on `device`: the decode tables' positions when set (no upload).
  Tensor position_tensor(Device device) const;
};

class KVCache {
 public:
  // Writes the new tokens' keys k (T_new, H_kv, D_qk) and values v (T_new, H_kv, D_v) into their
  // sequences' slots (host tables; a step with decode tables goes through attend_appending). The first call allocates
  // the cache (zeros, k's and v's dtype and device); later calls must match its shapes, dtype, device, sequence count
  // and capacity.
  void append(const Tensor& k, const Tensor& v, const KVCacheStep& step);

  // Allocates the cache (zeros) for k's and v's shapes, dtype and device if it is empty, else checks that
  // they and the step match it (append does this first).
  void reserve(const Tensor& k, const Tensor& v, const KVCacheStep& step);
  bool empty() const { return !keys_.defined(); }
  const Tensor& keys() const { return keys_; }      // (S * capacity, H_kv, D_qk)
  const Tensor& values() const { return values_; }  // (S * capacity, H_kv, D_v)
  // Frees the storage (the next append allocates again).
  void clear();

 private:
  Tensor keys_, values_;
  int64_t num_sequences_ = 0;
  int64_t capacity_ = 0;
};

// Appends the new tokens' keys k and values v to `cache` and returns their queries' attention over their
// sequences' cached tokens: out (T_new, H, D_v). A decoding step with tables: decode_attention_append
// (one kernel, lengths from the device, range-checked once a step); else append and dot_product_attention
// over attention_info().
Tensor attend_appending(const Tensor& q, const Tensor& k, const Tensor& v, KVCache& cache, const AttentionSpec& spec,
                        const KVCacheStep& step, const AttentionKernelConfig& config = {});

// Throws unless a cached call can run: thd layout, a causal mask, grad mode off (the cache holds
// copies outside the autograd graph) and x (T_new, hidden) with the step's T_new rows.
void check_cached_attention(const AttentionSpec& spec, const Tensor& x, const KVCacheStep& step, const char* op);
}  // namespace cpf::nn
