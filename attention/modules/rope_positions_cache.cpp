// The per-thread RoPE positions cache (rope_positions_cache.h).
#include "attention/modules/rope_positions_cache.h"

#include <algorithm>
#include <vector>

#include "attention/modules/attention_layout.h"
#include "framework/tensor/device_stream.h"

namespace cpf::attention_modules {
namespace {

// One side's sequence arrays: what the positions of that side are made of.
struct SideArrays {
  std::vector<int64_t> cu_seqlens, cu_seqlens_padded, positions;
  bool operator==(const SideArrays&) const = default;
};

struct Key {
  Device device;
  void* stream = nullptr;
  QkvFormat format = QkvFormat::bshd;
  Shape token_dims;  // x's dims but the trailing (H, D)
  bool kv = false;
  int64_t cp_size = 1, cp_rank = 0;
  bool has_seq = false;
  SideArrays side;  // empty without a SequenceInfo
};

// Cheap fields first; the arrays (up to one entry per token) last.
bool same_key(const Key& a, const Key& b) {
  return a.device == b.device && a.stream == b.stream && a.format == b.format && a.kv == b.kv &&
         a.cp_size == b.cp_size && a.cp_rank == b.cp_rank && a.has_seq == b.has_seq && a.token_dims == b.token_dims &&
         a.side == b.side;
}

Key key_of(const Tensor& x_heads, QkvFormat format, const std::optional<SequenceInfo>& seq, bool kv, int64_t cp_size,
           int64_t cp_rank) {
  Key key;
  key.device = x_heads.device();
  key.stream = DeviceStream::current(x_heads.device()).handle();
  key.format = format;
  const Shape& shape = x_heads.shape();
  key.token_dims.assign(shape.begin(), shape.end() - std::min<size_t>(2, shape.size()));
  key.kv = kv;
  key.cp_size = cp_size;
  key.cp_rank = cp_rank;
  key.has_seq = seq.has_value();
  if (seq) {
    key.side = kv ? SideArrays{seq->cu_seqlens_kv, seq->cu_seqlens_kv_padded, seq->kv_positions}
                  : SideArrays{seq->cu_seqlens_q, seq->cu_seqlens_q_padded, seq->q_positions};
  }
  return key;
}

struct Entry {
  Key key;
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
  Key key = key_of(x_heads, format, seq, kv, cp_size, cp_rank);
  const auto hit =
      std::find_if(cache.entries.begin(), cache.entries.end(), [&](const Entry& e) { return same_key(e.key, key); });
  if (hit != cache.entries.end()) {
    std::rotate(cache.entries.begin(), hit, hit + 1);
    ++cache.stats.hits;
    return cache.entries.front().table;
  }
  Tensor table = cp_size == 1 ? rope_positions(x_heads, format, seq, kv)
                              : cp_rope_positions(x_heads, format, seq, kv, cp_size, cp_rank);
  ++cache.stats.builds;
  cache.entries.insert(cache.entries.begin(), Entry{std::move(key), table});
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

}  // namespace cpf::attention_modules
