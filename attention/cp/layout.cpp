#include "attention/cp/layout.h"

#include <algorithm>

#include "attention/mask.h"
#include "framework/tensor/ops/index.h"

namespace cpf::cp {

bool GroupLayout::identity_order() const {
  for (size_t i = 0; i < to_sequence_major.size(); ++i) {
    if (to_sequence_major[i] != static_cast<int64_t>(i)) return false;
  }
  return true;
}

namespace {

// The position of global storage token `global` as a query or key: the explicit one, or its slot index.
int64_t position_of(const std::vector<int64_t>& explicit_positions, int64_t global, int64_t slot_index) {
  return explicit_positions.empty() ? slot_index : explicit_positions[static_cast<size_t>(global)];
}

}  // namespace

GroupLayout make_group_layout(const GlobalSequences& global, int64_t cp_size, const std::vector<int>& members) {
  CPF_CHECK(!members.empty(), "make_group_layout: empty member list");
  CPF_CHECK((global.q_positions.empty() ||
             static_cast<int64_t>(global.q_positions.size()) == global.cu_seqlens_padded.back()) &&
                (global.kv_positions.empty() ||
                 static_cast<int64_t>(global.kv_positions.size()) == global.cu_seqlens_padded.back()),
            "make_group_layout: ", global.q_positions.size(), " q and ", global.kv_positions.size(),
            " kv positions for a batch of ", global.cu_seqlens_padded.back(), " storage tokens");
  GroupLayout layout;
  layout.members = members;
  std::vector<ThdShard> shards;
  std::vector<int64_t> member_offset;  // first member-major index of each member's block
  int64_t total = 0;
  for (int m : members) {
    shards.push_back(thd_shard(global.cu_seqlens, global.cu_seqlens_padded, cp_size, m));
    member_offset.push_back(total);
    total += shards.back().local_tokens();
  }
  std::vector<int64_t> cu_real{0}, cu_padded{0}, q_positions, kv_positions;
  layout.to_sequence_major.reserve(static_cast<size_t>(total));
  struct Token {
    int64_t slot_index, member_major, global;
  };
  std::vector<Token> tokens;
  auto append = [&](const Token& tok) {
    layout.to_sequence_major.push_back(tok.member_major);
    layout.global_index.push_back(tok.global);
    layout.slot_index.push_back(tok.slot_index);
    q_positions.push_back(position_of(global.q_positions, tok.global, tok.slot_index));
    kv_positions.push_back(position_of(global.kv_positions, tok.global, tok.slot_index));
  };
  for (int64_t s = 0; s < global.num_sequences(); ++s) {
    // Real tokens of every member first, in slot order (so a sequence gathered from all members is one
    // contiguous run, which cuDNN's index-based masks can express), then every member's padding.
    for (const bool real : {true, false}) {
      tokens.clear();
      for (size_t m = 0; m < shards.size(); ++m) {
        const ThdShard& sh = shards[m];
        for (int64_t t = sh.cu_seqlens_padded_local[s]; t < sh.cu_seqlens_padded_local[s + 1]; ++t) {
          if ((sh.valid[t] != 0) == real) tokens.push_back({sh.position[t], member_offset[m] + t, sh.global_index[t]});
        }
      }
      if (real) {
        std::stable_sort(tokens.begin(), tokens.end(),
                         [](const Token& a, const Token& b) { return a.slot_index < b.slot_index; });
        cu_real.push_back(cu_real.back() + static_cast<int64_t>(tokens.size()));
      }
      for (const Token& tok : tokens) append(tok);
    }
    cu_padded.push_back(static_cast<int64_t>(layout.global_index.size()));
  }
  layout.to_member_major.assign(static_cast<size_t>(total), 0);
  for (int64_t s = 0; s < total; ++s) layout.to_member_major[layout.to_sequence_major[s]] = s;
  // cu_seqlens here are this storage's real counts; slot starts are cu_padded.
  layout.info = SequenceInfo::from_cu_seqlens(cu_real, cu_padded);
  layout.info = layout.info.with_positions(std::move(q_positions), std::move(kv_positions));
  return layout;
}

namespace {
Tensor reorder_rows(const Tensor& t, const std::vector<int64_t>& order, const GroupLayout& layout) {
  CPF_CHECK(t.dim() >= 1 && t.size(0) == layout.tokens(), "context parallel: a tensor of shape ", t.shape(),
            " does not hold the ", layout.tokens(), " tokens of its layout");
  if (layout.identity_order()) return t;
  return raw::index_select(t, 0, from_vector(order, {static_cast<int64_t>(order.size())}, t.device()));
}
}  // namespace

Tensor to_sequence_major(const Tensor& member_major, const GroupLayout& layout) {
  return reorder_rows(member_major, layout.to_sequence_major, layout);
}

Tensor to_member_major(const Tensor& sequence_major, const GroupLayout& layout) {
  return reorder_rows(sequence_major, layout.to_member_major, layout);
}

std::vector<SequenceInfo> split_query_runs(const SequenceInfo& info) {
  return split_query_runs(info, info.q_positions);
}

std::vector<SequenceInfo> split_query_runs(const SequenceInfo& info, const std::vector<int64_t>& run_keys) {
  CPF_CHECK(static_cast<int64_t>(run_keys.size()) == info.q_storage_tokens(), "split_query_runs: ", run_keys.size(),
            " run keys for ", info.q_storage_tokens(), " query storage tokens");
  const int64_t n = info.num_sequences();
  // Per sequence: (offset in the slot, length) of each run of consecutive keys.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> runs(static_cast<size_t>(n));
  size_t most = 0;
  for (int64_t s = 0; s < n; ++s) {
    auto& r = runs[static_cast<size_t>(s)];
    const int64_t start = info.q_start(s);
    for (int64_t t = 0; t < info.q_length(s); ++t) {
      const int64_t key = run_keys[static_cast<size_t>(start + t)];
      if (!r.empty() && run_keys[static_cast<size_t>(start + t - 1)] + 1 == key) {
        r.back().second += 1;
      } else {
        r.push_back({t, 1});
      }
    }
    most = std::max(most, r.size());
  }
  if (most <= 1) return {info};
  std::vector<SequenceInfo> parts;
  for (size_t k = 0; k < most; ++k) {
    std::vector<int64_t> cu{0}, padded;
    for (int64_t s = 0; s < n; ++s) {
      const auto& r = runs[static_cast<size_t>(s)];
      const auto [offset, length] = k < r.size() ? r[k] : std::pair<int64_t, int64_t>{info.q_length(s), 0};
      padded.push_back(info.q_start(s) + offset);
      cu.push_back(cu.back() + length);
    }
    padded.push_back(info.q_storage_tokens());
    SequenceInfo part = SequenceInfo::from_cu_seqlens(cu, info.cu_seqlens_kv, padded, info.cu_seqlens_kv_padded);
    parts.push_back(part.with_positions(info.q_positions, info.kv_positions));
  }
  return parts;
}

SequenceInfo pair_sequence_info(const GroupLayout& q, const GroupLayout& kv) {
  SequenceInfo info = SequenceInfo::from_cu_seqlens(q.info.cu_seqlens_q, kv.info.cu_seqlens_q,
                                                    q.info.cu_seqlens_q_padded, kv.info.cu_seqlens_q_padded);
  return info.with_positions(q.info.q_positions, kv.info.kv_positions);
}

}  // namespace cpf::cp

namespace cpf::cp {
namespace {

// The position range of each run of consecutive slot indices (a chunk) among the real tokens of
// sequence n, taken from `positions` (the layout's q or kv positions): with the default positions a
// run's positions are consecutive and the range is exact; explicit ones give the run's hull.
std::vector<PositionRange> position_runs(const GroupLayout& layout, int64_t n, const std::vector<int64_t>& positions) {
  std::vector<PositionRange> runs;
  const auto& info = layout.info;
  const int64_t start = info.cu_seqlens_q_padded[n];
  const int64_t real = info.cu_seqlens_q[n + 1] - info.cu_seqlens_q[n];
  for (int64_t t = start; t < start + real; ++t) {
    const int64_t p = positions[t];
    if (t > start && layout.slot_index[t - 1] + 1 == layout.slot_index[t]) {
      runs.back().min = std::min(runs.back().min, p);
      runs.back().max = std::max(runs.back().max, p);
    } else {
      runs.push_back({p, p});
    }
  }
  return runs;
}

}  // namespace

bool any_visible(const GroupLayout& q, const GroupLayout& kv, const AttentionWindow& window) {
  for (int64_t n = 0; n < q.info.num_sequences(); ++n) {
    const auto kv_runs = position_runs(kv, n, kv.info.kv_positions);
    for (const PositionRange& qr : position_runs(q, n, q.info.q_positions)) {
      for (const PositionRange& kr : kv_runs) {
        if (classify_tile(qr, kr, window) != TileKind::empty) return true;
      }
    }
  }
  return false;
}

}  // namespace cpf::cp
