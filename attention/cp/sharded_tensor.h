#pragma once
// How a tensor's tokens were cut along the sequence across a CP group, carried with the tensor.
//
// Q, K and V of one attention call must be cut the same way: a K/V split into contiguous blocks
// while Q is dual-chunk has the same shapes but other tokens, and attention over it is silently
// wrong. A ShardedTensor carries its Sharding from where it was cut (dual_chunk_shard /
// contiguous_shard below, or the caller's own tag) to cp::context_parallel_attention, which refuses
// any mismatch before communicating, naming the sharding of q, k and v.
//
//   P = 2, S = 8 (chunks of 2):   dual_chunk  rank 0: 0 1 6 7    rank 1: 2 3 4 5
//                                 contiguous  rank 0: 0 1 2 3    rank 1: 4 5 6 7
#include <cstdint>
#include <string>

#include "attention/cp/sharding.h"
#include "framework/tensor/tensor.h"

namespace cpf::cp {

enum class ShardScheme : uint8_t {
  dual_chunk,  // rank r holds chunks r and 2P-1-r of every sequence (sharding.h): what CP attention uses
  contiguous,  // rank r holds block r of P equal blocks (a plain split, as sequence-parallel activations)
};
std::string shard_scheme_name(ShardScheme scheme);  // "dual_chunk", "contiguous"

struct Sharding {
  ShardScheme scheme = ShardScheme::dual_chunk;
  int64_t cp_size = 1;
  int64_t rank = 0;

  static Sharding dual_chunk(int64_t cp_size, int64_t rank);
  static Sharding contiguous(int64_t cp_size, int64_t rank);
  bool operator==(const Sharding& other) const = default;
  // "dual_chunk(cp=4, rank=1: chunks 1 and 6 of 8)", "contiguous(cp=4, rank=1: block 1 of 4)".
  std::string str() const;
};

struct ShardedTensor {
  Tensor tensor;
  Sharding sharding;
};

// The rank's dual-chunk share of a global tensor along seq_dim (cp::shard_sequence), or of a packed
// thd batch (cp::shard_tokens), tagged as such.
ShardedTensor dual_chunk_shard(const Tensor& t, int64_t seq_dim, int64_t cp_size, int64_t rank);
ShardedTensor dual_chunk_shard(const Tensor& t, const ThdShard& shard);
// Block `rank` of `cp_size` equal blocks along seq_dim, tagged contiguous. CP attention refuses it.
ShardedTensor contiguous_shard(const Tensor& t, int64_t seq_dim, int64_t cp_size, int64_t rank);

// Throws unless q, k and v are all dual-chunk shards for CP rank `cp_rank` of a group of `cp_size`;
// the message starts with `who` and names the sharding of q, k and v.
void check_attention_shardings(const Sharding& q, const Sharding& k, const Sharding& v, int64_t cp_size,
                               int64_t cp_rank, const std::string& who);

}  // namespace cpf::cp
