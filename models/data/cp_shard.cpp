#include "models/data/cp_shard.h"

#include <algorithm>

namespace cpf::models::data {
namespace {

int64_t count_valid(const Tensor& labels) {
  const auto values = labels.to_vector<int64_t>();
  return static_cast<int64_t>(std::count_if(values.begin(), values.end(), [](int64_t l) { return l != kIgnoreLabel; }));
}

// The cp_size = 1 description of a THD batch: every token stays where it is.
cp::ThdShard identity_shard(const std::vector<int64_t>& cu, const std::vector<int64_t>& padded) {
  const bool even = [&] {
    for (size_t s = 1; s < padded.size(); ++s) {
      if ((padded[s] - padded[s - 1]) % 2 != 0) return false;
    }
    return true;
  }();
  if (even) return cp::thd_shard(cu, padded, 1, 0);  // chunks 0 and 1 in order: the identity
  cp::ThdShard shard;
  shard.cu_seqlens = cu;
  shard.cu_seqlens_padded = padded;
  shard.cu_seqlens_padded_local = padded;
  for (size_t s = 0; s + 1 < padded.size(); ++s) {
    const int64_t real = cu[s + 1] - cu[s];
    shard.real_first_half.push_back(real);
    shard.real_second_half.push_back(0);
    for (int64_t i = 0; i < padded[s + 1] - padded[s]; ++i) {
      shard.global_index.push_back(padded[s] + i);
      shard.sequence.push_back(static_cast<int64_t>(s));
      shard.position.push_back(i);
      shard.valid.push_back(i < real ? 1 : 0);
    }
  }
  return shard;
}

}  // namespace

LocalBatch shard_for_rank(const Batch& batch, int64_t cp_size, int64_t cp_rank) {
  CPF_CHECK(cp_size >= 1, "shard_for_rank: cp_size=", cp_size, " must be at least 1");
  CPF_CHECK(cp_rank >= 0 && cp_rank < cp_size, "shard_for_rank: cp_rank=", cp_rank, " is outside the CP group of size ",
            cp_size);
  CPF_CHECK(batch.tokens.defined() && batch.labels.defined() && batch.positions.defined(),
            "shard_for_rank: the batch has no tensors");
  const int64_t factor = 2 * cp_size;
  LocalBatch local;
  local.layout = batch.layout;
  local.cp_size = cp_size;
  local.cp_rank = cp_rank;
  local.global_num_valid_labels = batch.num_valid_labels;
  if (batch.layout == Layout::thd) {
    for (int64_t s = 0; s < batch.num_sequences(); ++s) {
      const int64_t slot = batch.cu_seqlens_padded[s + 1] - batch.cu_seqlens_padded[s];
      CPF_CHECK(cp_size == 1 || slot % factor == 0, "shard_for_rank: sequence ", s, " has a slot of ", slot,
                " tokens, not a multiple of 2*cp_size=", factor,
                "; the batch was packed with pad_multiple=", batch.pad_multiple, ", set pad_multiple to a multiple of ",
                factor);
    }
    local.thd = cp_size == 1 ? identity_shard(batch.cu_seqlens, batch.cu_seqlens_padded)
                             : cp::thd_shard(batch.cu_seqlens, batch.cu_seqlens_padded, cp_size, cp_rank);
    local.tokens = cp::shard_tokens(batch.tokens, local.thd);
    local.labels = cp::shard_tokens(batch.labels, local.thd);
    local.positions = cp::shard_tokens(batch.positions, local.thd);
  } else {
    CPF_CHECK(batch.tokens.dim() == 2, "shard_for_rank: a bshd batch needs (B, T) tensors, got ", batch.tokens.shape());
    const int64_t T = batch.tokens.size(1);
    CPF_CHECK(cp_size == 1 || T % factor == 0, "shard_for_rank: seq_len=", T,
              " is not a multiple of 2*cp_size=", factor,
              "; the batch was packed with pad_multiple=", batch.pad_multiple, ", set pad_multiple to a multiple of ",
              factor);
    if (cp_size == 1) {
      local.tokens = batch.tokens;
      local.labels = batch.labels;
      local.positions = batch.positions;
    } else {
      local.tokens = cp::shard_sequence(batch.tokens, 1, cp_size, cp_rank);
      local.labels = cp::shard_sequence(batch.labels, 1, cp_size, cp_rank);
      local.positions = cp::shard_sequence(batch.positions, 1, cp_size, cp_rank);
    }
  }
  local.num_valid_labels = count_valid(local.labels);
  return local;
}

Batch unshard_batch(const std::vector<LocalBatch>& shards) {
  CPF_CHECK(!shards.empty(), "unshard_batch: no shards given");
  const int64_t cp_size = static_cast<int64_t>(shards.size());
  const Layout layout = shards.front().layout;
  for (int64_t r = 0; r < cp_size; ++r) {
    const LocalBatch& s = shards[static_cast<size_t>(r)];
    CPF_CHECK(s.cp_size == cp_size && s.cp_rank == r && s.layout == layout, "unshard_batch: shard ", r, " is rank ",
              s.cp_rank, " of ", s.cp_size, ", expected rank ", r, " of ", cp_size, " with one layout");
  }
  Batch batch;
  batch.layout = layout;
  batch.pad_multiple = cp_size == 1 ? 1 : 2 * cp_size;  // the least the shards prove
  batch.num_valid_labels = shards.front().global_num_valid_labels;
  auto gather = [&](Tensor LocalBatch::*member) {
    std::vector<Tensor> parts;
    for (const LocalBatch& s : shards) parts.push_back(s.*member);
    if (cp_size == 1) return parts.front();
    if (layout == Layout::bshd) return cp::unshard_sequence(parts, 1);
    std::vector<cp::ThdShard> infos;
    for (const LocalBatch& s : shards) infos.push_back(s.thd);
    return cp::unshard_tokens(parts, infos);
  };
  batch.tokens = gather(&LocalBatch::tokens);
  batch.labels = gather(&LocalBatch::labels);
  batch.positions = gather(&LocalBatch::positions);
  if (layout == Layout::thd) {
    batch.cu_seqlens = shards.front().thd.cu_seqlens;
    batch.cu_seqlens_padded = shards.front().thd.cu_seqlens_padded;
  }
  return batch;
}

}  // namespace cpf::models::data
