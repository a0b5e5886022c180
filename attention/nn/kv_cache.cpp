#include "attention/nn/kv_cache.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "attention/decode_attention.h"
#include "framework/autograd/grad_mode.h"
#include "framework/core/error.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/views.h"

namespace cpf::nn {

int64_t KVCacheStep::total_new() const { return std::accumulate(new_tokens.begin(), new_tokens.end(), int64_t{0}); }

void KVCacheStep::check() const {
  CPF_CHECK(!past.empty() && past.size() == new_tokens.size(), "KVCacheStep: past and new_tokens need one entry per ",
            "sequence (at least one): past=", past, " new_tokens=", new_tokens);
  CPF_CHECK(capacity >= 1, "KVCacheStep: capacity=", capacity, " must be at least 1");
  for (size_t n = 0; n < past.size(); ++n) {
    CPF_CHECK(past[n] >= 0 && new_tokens[n] >= 0, "KVCacheStep: sequence ", n, " has past=", past[n],
              " new_tokens=", new_tokens[n], "; both must be >= 0");
    CPF_CHECK(past[n] + new_tokens[n] <= capacity, "KVCacheStep: sequence ", n, " would hold ", past[n], " + ",
              new_tokens[n], " tokens but its slot holds capacity=", capacity,
              " (restart it with past=0 or allocate a larger cache)");
  }
  CPF_CHECK(total_new() >= 1, "KVCacheStep: no sequence has new tokens: new_tokens=", new_tokens);
  if (decode == nullptr) return;
  const int64_t seqs = num_sequences();
  CPF_CHECK(
      std::all_of(new_tokens.begin(), new_tokens.end(), [](int64_t t) { return t == 1; }),
      "KVCacheStep: a step with decode tables feeds exactly one new token per sequence, got new_tokens=", new_tokens);
  for (const Tensor* t : {&decode->positions, &decode->lengths}) {
    CPF_CHECK(t->defined() && t->dim() == 1 && t->size(0) == seqs && t->dtype() == DType::i64,
              "KVCacheStep: the decode tables must be (", seqs, ") i64 tensors, got ",
              t->defined() ? t->shape() : Shape{},
              t->defined() ? " " + dtype_name(t->dtype()) : std::string(" (undefined)"));
  }
}

Tensor KVCacheStep::position_tensor(Device device) const {
  if (decode != nullptr) return decode->positions;
  const std::vector<int64_t> pos = positions();
  return from_vector(pos, {static_cast<int64_t>(pos.size())}, device);
}

SequenceInfo KVCacheStep::attention_info() const {
  check();
  std::vector<int64_t> kv_lengths(past.size()), kv_offsets(past.size(), 0);
  for (size_t n = 0; n < past.size(); ++n) kv_lengths[n] = past[n] + new_tokens[n];
  return SequenceInfo::from_lengths(new_tokens, kv_lengths, 0, capacity).with_position_offsets(past, kv_offsets);
}

std::vector<int64_t> KVCacheStep::positions() const {
  std::vector<int64_t> pos;
  pos.reserve(static_cast<size_t>(total_new()));
  for (size_t n = 0; n < past.size(); ++n) {
    for (int64_t i = 0; i < new_tokens[n]; ++i) pos.push_back(past[n] + i);
  }
  return pos;
}

void KVCache::reserve(const Tensor& k, const Tensor& v, const KVCacheStep& step) {
  step.check();
  const int64_t t_new = step.total_new();
  CPF_CHECK(k.defined() && v.defined() && k.dim() == 3 && v.dim() == 3 && k.size(0) == t_new && v.size(0) == t_new &&
                k.size(1) == v.size(1),
            "KVCache: keys (T_new, H_kv, D_qk) and values (T_new, H_kv, D_v) for the step's ", t_new,
            " new tokens, got k=", k.defined() ? k.shape() : Shape{}, " v=", v.defined() ? v.shape() : Shape{});
  if (empty()) {
    num_sequences_ = step.num_sequences();
    capacity_ = step.capacity;
    const int64_t rows = num_sequences_ * capacity_;
    keys_ = zeros({rows, k.size(1), k.size(2)}, {.dtype = k.dtype(), .device = k.device()});
    values_ = zeros({rows, v.size(1), v.size(2)}, {.dtype = v.dtype(), .device = v.device()});
  }
  CPF_CHECK(step.num_sequences() == num_sequences_ && step.capacity == capacity_, "KVCache: allocated for ",
            num_sequences_, " sequences of capacity ", capacity_, ", but the step has ", step.num_sequences(),
            " sequences of capacity ", step.capacity, " (clear() the cache to change them)");
  CPF_CHECK(k.dtype() == keys_.dtype() && v.dtype() == values_.dtype() && k.device() == keys_.device() &&
                v.device() == values_.device() && k.size(1) == keys_.size(1) && k.size(2) == keys_.size(2) &&
                v.size(2) == values_.size(2),
            "KVCache: the cache holds keys ", keys_.shape(), " ", dtype_name(keys_.dtype()), " on ", keys_.device(),
            " and values ", values_.shape(), "; got k=", k.shape(), " ", dtype_name(k.dtype()), " on ", k.device(),
            " v=", v.shape());
}

void KVCache::append(const Tensor& k, const Tensor& v, const KVCacheStep& step) {
  reserve(k, v, step);
  int64_t row = 0;
  for (int64_t n = 0; n < step.num_sequences(); ++n) {
    const int64_t count = step.new_tokens[static_cast<size_t>(n)];
    if (count == 0) continue;
    const int64_t slot_row = n * capacity_ + step.past[static_cast<size_t>(n)];
    raw::copy_(raw::narrow(keys_, 0, slot_row, count), raw::narrow(k, 0, row, count));
    raw::copy_(raw::narrow(values_, 0, slot_row, count), raw::narrow(v, 0, row, count));
    row += count;
  }
}

void KVCache::clear() {
  keys_ = Tensor();
  values_ = Tensor();
  num_sequences_ = 0;
  capacity_ = 0;
}

Tensor attend_appending(const Tensor& q, const Tensor& k, const Tensor& v, KVCache& cache, const AttentionSpec& spec,
                        const KVCacheStep& step, const AttentionKernelConfig& config) {
  if (step.decode == nullptr) {
    cache.append(k, v, step);
    return dot_product_attention(q, cache.keys(), cache.values(), spec, step.attention_info(), config).out;
  }
  cache.reserve(k, v, step);
  const KVDecodeTables& t = *step.decode;
  const Tensor out = decode_attention_append(q, k, v, cache.keys(), cache.values(), t.lengths, spec,
                                             /*check_lengths=*/!t.lengths_checked);
  t.lengths_checked = true;
  return out;
}

void check_cached_attention(const AttentionSpec& spec, const Tensor& x, const KVCacheStep& step, const char* op) {
  CPF_CHECK(spec.qkv_format == QkvFormat::thd, op, ": cached decoding needs qkv_format thd (new tokens packed per ",
            "sequence), got ", qkv_format_name(spec.qkv_format));
  CPF_CHECK(is_causal(spec.mask), op, ": cached decoding needs a causal mask (a cached token must not see later ",
            "tokens), got mask ", mask_type_name(spec.mask));
  CPF_CHECK(!grad_enabled(), op, ": cached decoding runs without autograd (the cache holds copies outside the ",
            "graph); call it under NoGradGuard");
  step.check();
  CPF_CHECK(x.defined() && x.dim() == 2 && x.size(0) == step.total_new(), op, ": x must be (T_new, hidden) with the ",
            "step's ", step.total_new(), " new tokens, got ", x.defined() ? x.shape() : Shape{});
}

}  // namespace cpf::nn
