#include "attention/cp/sharding.h"

#include <algorithm>

#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/views.h"
#include "framework/tensor/shape_utils.h"

namespace cpf::cp {
namespace {

void check_cp(int64_t cp_size, int64_t rank, const char* op) {
  CPF_CHECK(cp_size >= 1, op, ": cp_size=", cp_size, " must be at least 1");
  CPF_CHECK(rank >= 0 && rank < cp_size, op, ": rank=", rank, " is outside the CP group of size ", cp_size);
}

// Copies `length` rows starting at `src_start` of src (along dim) to `dst_start` of dst.
void copy_rows(const Tensor& dst, int64_t dst_start, const Tensor& src, int64_t src_start, int64_t length,
               int64_t dim) {
  if (length == 0) return;
  raw::copy_(raw::narrow(dst, dim, dst_start, length), raw::narrow(src, dim, src_start, length));
}

}  // namespace

std::array<int64_t, 2> dual_chunk_ids(int64_t cp_size, int64_t rank) {
  check_cp(cp_size, rank, "dual_chunk_ids");
  return {rank, 2 * cp_size - 1 - rank};
}

std::vector<int64_t> dual_chunk_positions(int64_t seq_len, int64_t cp_size, int64_t rank) {
  check_cp(cp_size, rank, "dual_chunk_positions");
  CPF_CHECK(seq_len % (2 * cp_size) == 0, "context parallel: sequence length ", seq_len,
            " is not divisible by 2*cp_size=", 2 * cp_size, " (pad the sequence to a multiple of ", 2 * cp_size, ")");
  const int64_t chunk = seq_len / (2 * cp_size);
  std::vector<int64_t> positions;
  positions.reserve(static_cast<size_t>(2 * chunk));
  for (int64_t id : dual_chunk_ids(cp_size, rank)) {
    for (int64_t i = 0; i < chunk; ++i) positions.push_back(id * chunk + i);
  }
  return positions;
}

std::vector<int64_t> pad_cu_seqlens(const std::vector<int64_t>& cu_seqlens, int64_t cp_size) {
  CPF_CHECK(!cu_seqlens.empty() && cu_seqlens.front() == 0, "pad_cu_seqlens: cu_seqlens must start at 0, got ",
            cu_seqlens);
  const int64_t factor = 2 * cp_size;
  std::vector<int64_t> padded{0};
  for (size_t i = 1; i < cu_seqlens.size(); ++i) {
    const int64_t length = cu_seqlens[i] - cu_seqlens[i - 1];
    CPF_CHECK(length >= 0, "pad_cu_seqlens: cu_seqlens decreases at index ", i, ": ", cu_seqlens);
    padded.push_back(padded.back() + (length + factor - 1) / factor * factor);
  }
  return padded;
}

ThdShard thd_shard(const std::vector<int64_t>& cu_seqlens, const std::vector<int64_t>& cu_seqlens_padded,
                   int64_t cp_size, int64_t rank) {
  check_cp(cp_size, rank, "thd_shard");
  CPF_CHECK(cu_seqlens.size() == cu_seqlens_padded.size() && !cu_seqlens.empty(), "thd_shard: cu_seqlens ", cu_seqlens,
            " and cu_seqlens_padded ", cu_seqlens_padded, " must have the same, non-zero number of entries");
  CPF_CHECK(cu_seqlens.front() == 0 && cu_seqlens_padded.front() == 0, "thd_shard: cu_seqlens ", cu_seqlens,
            " and cu_seqlens_padded ", cu_seqlens_padded, " must start at 0");
  const int64_t factor = 2 * cp_size;
  ThdShard shard;
  shard.cp_size = cp_size;
  shard.rank = rank;
  shard.cu_seqlens = cu_seqlens;
  shard.cu_seqlens_padded = cu_seqlens_padded;
  shard.cu_seqlens_padded_local.push_back(0);
  const auto ids = dual_chunk_ids(cp_size, rank);
  for (size_t s = 0; s + 1 < cu_seqlens.size(); ++s) {
    const int64_t real = cu_seqlens[s + 1] - cu_seqlens[s];
    const int64_t padded = cu_seqlens_padded[s + 1] - cu_seqlens_padded[s];
    CPF_CHECK(real >= 0 && padded >= real, "thd_shard: sequence ", s, " has real length ", real, " and padded length ",
              padded, " (cu_seqlens ", cu_seqlens, ", cu_seqlens_padded ", cu_seqlens_padded,
              "): need 0 <= real <= padded");
    CPF_CHECK(padded % factor == 0, "context parallel: padded length ", padded, " of sequence ", s,
              " is not divisible by 2*cp_size=", factor, "; pad every sequence to a multiple of ", factor,
              " (cu_seqlens_padded=", cu_seqlens_padded, ", see cp::pad_cu_seqlens)");
    const int64_t chunk = padded / factor;
    shard.cu_seqlens_padded_local.push_back(shard.cu_seqlens_padded_local.back() + 2 * chunk);
    for (int half = 0; half < 2; ++half) {
      const int64_t first = ids[half] * chunk;
      const int64_t real_here = std::clamp<int64_t>(real - first, 0, chunk);
      (half == 0 ? shard.real_first_half : shard.real_second_half).push_back(real_here);
      for (int64_t i = 0; i < chunk; ++i) {
        shard.global_index.push_back(cu_seqlens_padded[s] + first + i);
        shard.sequence.push_back(static_cast<int64_t>(s));
        shard.position.push_back(first + i);
        shard.valid.push_back(first + i < real ? 1 : 0);
      }
    }
  }
  return shard;
}

Tensor shard_sequence(const Tensor& t, int64_t seq_dim, int64_t cp_size, int64_t rank) {
  const int64_t dim = normalize_dim(seq_dim, t.dim(), "shard_sequence");
  const int64_t seq_len = t.size(dim);
  const auto positions = dual_chunk_positions(seq_len, cp_size, rank);  // validates divisibility
  const int64_t chunk = seq_len / (2 * cp_size);
  Shape shape = t.shape();
  shape[dim] = 2 * chunk;
  Tensor out = empty(shape, {.dtype = t.dtype(), .device = t.device()});
  const auto ids = dual_chunk_ids(cp_size, rank);
  copy_rows(out, 0, t, ids[0] * chunk, chunk, dim);
  copy_rows(out, chunk, t, ids[1] * chunk, chunk, dim);
  return out;
}

Tensor unshard_sequence(const std::vector<Tensor>& shards, int64_t seq_dim) {
  CPF_CHECK(!shards.empty(), "unshard_sequence: no shards given");
  const int64_t cp_size = static_cast<int64_t>(shards.size());
  const Tensor& first = shards.front();
  const int64_t dim = normalize_dim(seq_dim, first.dim(), "unshard_sequence");
  CPF_CHECK(first.size(dim) % 2 == 0, "unshard_sequence: local length ", first.size(dim), " is not even");
  const int64_t chunk = first.size(dim) / 2;
  Shape shape = first.shape();
  shape[dim] = 2 * chunk * cp_size;
  Tensor out = empty(shape, {.dtype = first.dtype(), .device = first.device()});
  for (int64_t r = 0; r < cp_size; ++r) {
    CPF_CHECK(shards[r].shape() == first.shape(), "unshard_sequence: shard ", r, " has shape ", shards[r].shape(),
              ", shard 0 has ", first.shape());
    const auto ids = dual_chunk_ids(cp_size, r);
    copy_rows(out, ids[0] * chunk, shards[r], 0, chunk, dim);
    copy_rows(out, ids[1] * chunk, shards[r], chunk, chunk, dim);
  }
  return out;
}

Tensor shard_tokens(const Tensor& t, const ThdShard& shard) {
  CPF_CHECK(t.dim() >= 1 && t.size(0) == shard.cu_seqlens_padded.back(), "shard_tokens: tensor of shape ", t.shape(),
            " does not hold the ", shard.cu_seqlens_padded.back(), " tokens of cu_seqlens_padded ",
            shard.cu_seqlens_padded);
  Shape shape = t.shape();
  shape[0] = shard.local_tokens();
  Tensor out = empty(shape, {.dtype = t.dtype(), .device = t.device()});
  // Tokens come in contiguous runs (one per chunk): copy run by run.
  int64_t local = 0;
  while (local < shard.local_tokens()) {
    int64_t run = 1;
    while (local + run < shard.local_tokens() && shard.global_index[local + run] == shard.global_index[local] + run) {
      ++run;
    }
    copy_rows(out, local, t, shard.global_index[local], run, 0);
    local += run;
  }
  return out;
}

Tensor unshard_tokens(const std::vector<Tensor>& shards, const std::vector<ThdShard>& infos) {
  CPF_CHECK(!shards.empty() && shards.size() == infos.size(), "unshard_tokens: ", shards.size(), " shards for ",
            infos.size(), " shard descriptions");
  Shape shape = shards.front().shape();
  shape[0] = infos.front().cu_seqlens_padded.back();
  Tensor out = zeros(shape, {.dtype = shards.front().dtype(), .device = shards.front().device()});
  for (size_t r = 0; r < shards.size(); ++r) {
    const ThdShard& info = infos[r];
    CPF_CHECK(shards[r].size(0) == info.local_tokens(), "unshard_tokens: shard ", r, " has ", shards[r].size(0),
              " tokens, its description ", info.local_tokens());
    for (int64_t local = 0; local < info.local_tokens(); ++local) {
      copy_rows(out, info.global_index[local], shards[r], local, 1, 0);
    }
  }
  return out;
}

namespace {

// Moves 2P chunks along dim: out chunk k = in chunk source[k].
Tensor permute_chunks(const Tensor& t, int64_t dim, const std::vector<int64_t>& source) {
  const int64_t d = normalize_dim(dim, t.dim(), "reorder chunks");
  const int64_t n = static_cast<int64_t>(source.size());
  CPF_CHECK(t.size(d) % n == 0, "reorder chunks: length ", t.size(d), " along dim ", d, " is not divisible into ", n,
            " chunks");
  const int64_t chunk = t.size(d) / n;
  Tensor out = empty(t.shape(), {.dtype = t.dtype(), .device = t.device()});
  for (int64_t k = 0; k < n; ++k) copy_rows(out, k * chunk, t, source[k] * chunk, chunk, d);
  return out;
}

}  // namespace

Tensor rank_order_to_sequence_order(const Tensor& t, int64_t dim, int64_t cp_size) {
  // Rank order holds chunks r, 2P-1-r for r = 0..P-1: sequence chunk k < P is at slot 2k,
  // chunk 2P-1-k at slot 2k+1.
  std::vector<int64_t> source(static_cast<size_t>(2 * cp_size));
  for (int64_t k = 0; k < cp_size; ++k) {
    source[k] = 2 * k;
    source[2 * cp_size - 1 - k] = 2 * k + 1;
  }
  return permute_chunks(t, dim, source);
}

Tensor sequence_order_to_rank_order(const Tensor& t, int64_t dim, int64_t cp_size) {
  std::vector<int64_t> source(static_cast<size_t>(2 * cp_size));
  for (int64_t r = 0; r < cp_size; ++r) {
    source[2 * r] = r;
    source[2 * r + 1] = 2 * cp_size - 1 - r;
  }
  return permute_chunks(t, dim, source);
}

}  // namespace cpf::cp
