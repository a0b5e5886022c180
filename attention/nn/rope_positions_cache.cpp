// The per-thread RoPE positions cache (rope_positions_cache.h).
#include "attention/nn/rope_positions_cache.h"

#include <algorithm>
#include <vector>

#include "attention/nn/attention_layout.h"
#include "framework/tensor/device_stream.h"

namespace cpf::nn {
namespace {

// One side's sequence arrays: what the positions of that side are made of. Owned by a cache entry;
// a request only points at its SequenceInfo's (no copy on a hit).
struct SideArrays {
  std::vector<int64_t> cu_seqlens, cu_seqlens_padded, positions;
};
struct SideView {
  const std::vector<int64_t>* cu_seqlens = nullptr;
  const std::vector<int64_t>* cu_seqlens_padded = nullptr;
  const std::vector<int64_t>* positions = nullptr;
};

struct Key {
  Device device;
  void* stream = nullptr;
  QkvFormat format = QkvFormat::bshd;
  Shape token_dims;  // x's dims but the trailing (H, D)
  bool kv = false;
  int64_t cp_size = 1, cp_rank = 0;
  bool has_seq = false;
};

// Cheap fields first; the arrays (up to one entry per token) last.
bool same_request(const Key& a, const SideArrays& stored, const Key& b, const SideView& side) {
  if (!(a.device == b.device && a.stream == b.stream && a.format == b.format && a.kv == b.kv &&
        a.cp_size == b.cp_size && a.cp_rank == b.cp_rank && a.has_seq == b.has_seq && a.token_dims == b.token_dims)) {
    return false;
  }
  return !b.has_seq || (stored.cu_seqlens == *side.cu_seqlens && stored.cu_seqlens_padded == *side.cu_seqlens_padded &&
                        stored.positions == *side.positions);
}

Key key_of(const Tensor& x_heads, QkvFormat format, bool has_seq, bool kv, int64_t cp_size, int64_t cp_rank) {
  Key key;
  key.device = x_heads.device();
  key.stream = DeviceStream::current(x_heads.device()).handle();
  key.format = format;
  const Shape& shape = x_heads.shape();
  key.token_dims.assign(shape.begin(), shape.end() - std::min<size_t>(2, shape.size()));
  key.kv = kv;
  key.cp_size = cp_size;
  key.cp_rank = cp_rank;
  key.has_seq = has_seq;
  return key;
}

SideView side_of(const std::optional<SequenceInfo>& seq, bool kv) {
  if (!seq) return {};
  return kv ? SideView{&seq->cu_seqlens_kv, &seq->cu_seqlens_kv_padded, &seq->kv_positions}
            : SideView{&seq->cu_seqlens_q, &seq->cu_seqlens_q_padded, &seq->q_positions};
}

struct Entry {
  Key key;
  SideArrays side;  // empty without a SequenceInfo
  Tensor table;
};

struct Cache {
  std::vector<Entry> entries;  // most recently used first
  RopePositionsCacheStats stats;
};

Cache& thread_cache() {
  thread_local Cache cache;
  return cache;
}

}  // namespace

Tensor cached_rope_positions(const Tensor& x_heads, QkvFormat format, const std::optional<SequenceInfo>& seq, bool kv,
                             int64_t cp_size, int64_t cp_rank) {
  CPF_CHECK(x_heads.defined(), "rope positions: x is undefined");
  CPF_CHECK(cp_size >= 1 && cp_rank >= 0 && cp_rank < cp_size, "rope positions: cp_rank ", cp_rank,
            " is not a rank of a CP group of size ", cp_size);
  Cache& cache = thread_cache();
  Key key = key_of(x_heads, format, seq.has_value(), kv, cp_size, cp_rank);
  const SideView side = side_of(seq, kv);
  const auto hit = std::find_if(cache.entries.begin(), cache.entries.end(),
                                [&](const Entry& e) { return same_request(e.key, e.side, key, side); });
  if (hit != cache.entries.end()) {
    std::rotate(cache.entries.begin(), hit, hit + 1);
    ++cache.stats.hits;
    return cache.entries.front().table;
  }
  Tensor table = cp_size == 1 ? rope_positions(x_heads, format, seq, kv)
                              : cp_rope_positions(x_heads, format, seq, kv, cp_size, cp_rank);
  ++cache.stats.builds;
  SideArrays stored;
  if (seq) stored = {*side.cu_seqlens, *side.cu_seqlens_padded, *side.positions};
  cache.entries.insert(cache.entries.begin(), Entry{std::move(key), std::move(stored), table});
  if (cache.entries.size() > kRopePositionsCacheEntries) cache.entries.pop_back();
  return table;
}

bool same_rope_positions(const SequenceInfo& seq) {
  if (seq.cu_seqlens_q != seq.cu_seqlens_kv || seq.cu_seqlens_q_padded != seq.cu_seqlens_kv_padded) return false;
  // Both implicit: the index within the slot, on equal slots. Both explicit: the arrays themselves.
  if (seq.q_positions.empty() == seq.kv_positions.empty()) return seq.q_positions == seq.kv_positions;
  return seq.resolved_q_positions() == seq.resolved_kv_positions();
}

RopePositionsCacheStats rope_positions_cache_stats() { return thread_cache().stats; }

}  // namespace cpf::nn
