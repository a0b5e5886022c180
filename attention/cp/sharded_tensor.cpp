#include "attention/cp/sharded_tensor.h"

#include "framework/core/error.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/views.h"
#include "framework/tensor/shape_utils.h"

namespace cpf::cp {

std::string shard_scheme_name(ShardScheme scheme) {
  switch (scheme) {
    case ShardScheme::dual_chunk: return "dual_chunk";
    case ShardScheme::contiguous: return "contiguous";
  }
  return "?";
}

Sharding Sharding::dual_chunk(int64_t cp_size, int64_t rank) {
  dual_chunk_ids(cp_size, rank);  // validates the pair
  return {ShardScheme::dual_chunk, cp_size, rank};
}

Sharding Sharding::contiguous(int64_t cp_size, int64_t rank) {
  CPF_CHECK(cp_size >= 1 && rank >= 0 && rank < cp_size, "Sharding::contiguous: rank=", rank,
            " is outside a CP group of size ", cp_size);
  return {ShardScheme::contiguous, cp_size, rank};
}

std::string Sharding::str() const {
  std::string s = shard_scheme_name(scheme) + "(cp=" + std::to_string(cp_size) + ", rank=" + std::to_string(rank);
  if (scheme == ShardScheme::dual_chunk) {
    s += ": chunks " + std::to_string(rank) + " and " + std::to_string(2 * cp_size - 1 - rank) + " of " +
         std::to_string(2 * cp_size);
  } else {
    s += ": block " + std::to_string(rank) + " of " + std::to_string(cp_size);
  }
  return s + ")";
}

ShardedTensor dual_chunk_shard(const Tensor& t, int64_t seq_dim, int64_t cp_size, int64_t rank) {
  return {shard_sequence(t, seq_dim, cp_size, rank), Sharding::dual_chunk(cp_size, rank)};
}

ShardedTensor dual_chunk_shard(const Tensor& t, const ThdShard& shard) {
  return {shard_tokens(t, shard), Sharding::dual_chunk(shard.cp_size, shard.rank)};
}

ShardedTensor contiguous_shard(const Tensor& t, int64_t seq_dim, int64_t cp_size, int64_t rank) {
  const Sharding sharding = Sharding::contiguous(cp_size, rank);
  const int64_t dim = normalize_dim(seq_dim, t.dim(), "contiguous_shard");
  CPF_CHECK(t.size(dim) % cp_size == 0, "contiguous_shard: length ", t.size(dim), " along dim ", dim,
            " is not divisible by cp_size=", cp_size);
  const int64_t block = t.size(dim) / cp_size;
  return {raw::contiguous(raw::narrow(t, dim, rank * block, block)), sharding};
}

void check_attention_shardings(const Sharding& q, const Sharding& k, const Sharding& v, int64_t cp_size,
                               int64_t cp_rank, const std::string& who) {
  const std::string named = "q=" + q.str() + " k=" + k.str() + " v=" + v.str();
  CPF_CHECK(q == k && k == v, who, ": q, k and v are sharded differently along the sequence: ", named,
            "; cut all three with cp::dual_chunk_shard (the same tokens on every input)");
  CPF_CHECK(q.scheme == ShardScheme::dual_chunk, who, ": q, k and v are sharded ", shard_scheme_name(q.scheme), " (",
            named,
            ") but context parallel attention needs the dual-chunk layout; cut them with "
            "cp::dual_chunk_shard");
  CPF_CHECK(q.cp_size == cp_size && q.rank == cp_rank, who, ": q, k and v are sharded for cp=", q.cp_size,
            ", rank=", q.rank, " (", named, ") but this is CP rank ", cp_rank, " of a group of ", cp_size);
}

}  // namespace cpf::cp
