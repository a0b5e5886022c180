#include "attention/sequence_info.h"

#include <algorithm>

#include "framework/core/error.h"

namespace cpf {
namespace {

std::vector<int64_t> cumulative(const std::vector<int64_t>& lengths, const char* name) {
  std::vector<int64_t> cu{0};
  for (size_t i = 0; i < lengths.size(); ++i) {
    CPF_CHECK(lengths[i] >= 0, "SequenceInfo: ", name, " must be >= 0: ", name, "=", lengths);
    cu.push_back(cu.back() + lengths[i]);
  }
  return cu;
}

// Storage offsets of slots of `slot` tokens each, or of the packed sequences when slot = 0.
std::vector<int64_t> slot_offsets(const std::vector<int64_t>& lengths, int64_t slot, const char* lengths_name) {
  CPF_CHECK(slot >= 0, "SequenceInfo: the slot size must be >= 0 (0 = packed): slot=", slot);
  std::vector<int64_t> cu{0};
  for (int64_t len : lengths) {
    CPF_CHECK(slot == 0 || len <= slot, "SequenceInfo: ", lengths_name, " do not fit in slots of ", slot,
              " tokens: ", lengths_name, "=", lengths);
    cu.push_back(cu.back() + (slot == 0 ? len : slot));
  }
  return cu;
}

int64_t max_length(const std::vector<int64_t>& cu) {
  int64_t m = 0;
  for (size_t i = 0; i + 1 < cu.size(); ++i) m = std::max(m, cu[i + 1] - cu[i]);
  return m;
}

void check_side(const std::vector<int64_t>& cu, const std::vector<int64_t>& padded, int64_t max_seqlen,
                const std::vector<int64_t>& positions, const char* side) {
  CPF_CHECK(!cu.empty() && cu[0] == 0, "SequenceInfo: cu_seqlens_", side, " must start at 0: cu_seqlens_", side, "=",
            cu);
  for (size_t i = 0; i + 1 < cu.size(); ++i) {
    CPF_CHECK(cu[i + 1] >= cu[i], "SequenceInfo: cu_seqlens_", side, " must not decrease: cu_seqlens_", side, "=", cu);
  }
  CPF_CHECK(padded.size() == cu.size(), "SequenceInfo: cu_seqlens_", side, "_padded must have one entry per entry of ",
            "cu_seqlens_", side, ": cu_seqlens_", side, "=", cu, " cu_seqlens_", side, "_padded=", padded);
  CPF_CHECK(padded[0] >= 0, "SequenceInfo: storage offsets must be >= 0: cu_seqlens_", side, "_padded=", padded);
  for (size_t i = 0; i + 1 < cu.size(); ++i) {
    CPF_CHECK(padded[i + 1] - padded[i] >= cu[i + 1] - cu[i], "SequenceInfo: sequence ", i, " has ", cu[i + 1] - cu[i],
              " tokens but a slot of ", padded[i + 1] - padded[i],
              " (slots must be ordered and hold their sequence): cu_seqlens_", side, "=", cu, " cu_seqlens_", side,
              "_padded=", padded);
  }
  CPF_CHECK(max_seqlen >= max_length(cu), "SequenceInfo: max_seqlen_", side, "=", max_seqlen,
            " is below the longest sequence (", max_length(cu), ")");
  CPF_CHECK(positions.empty() || static_cast<int64_t>(positions.size()) == padded.back(), "SequenceInfo: ", side,
            "_positions has ", positions.size(), " entries but the storage holds ", padded.back(), " tokens");
}

std::vector<int64_t> slot_positions(const std::vector<int64_t>& padded, const std::vector<int64_t>& offsets) {
  std::vector<int64_t> pos(static_cast<size_t>(padded.back()), 0);
  for (size_t n = 0; n + 1 < padded.size(); ++n) {
    for (int64_t t = padded[n]; t < padded[n + 1]; ++t) pos[t] = offsets[n] + (t - padded[n]);
  }
  return pos;
}

}  // namespace

std::vector<int64_t> SequenceInfo::resolved_q_positions() const {
  if (!q_positions.empty()) return q_positions;
  return slot_positions(cu_seqlens_q_padded, std::vector<int64_t>(cu_seqlens_q_padded.size(), 0));
}

std::vector<int64_t> SequenceInfo::resolved_kv_positions() const {
  if (!kv_positions.empty()) return kv_positions;
  return slot_positions(cu_seqlens_kv_padded, std::vector<int64_t>(cu_seqlens_kv_padded.size(), 0));
}

SequenceInfo SequenceInfo::from_lengths(const std::vector<int64_t>& q_lengths, const std::vector<int64_t>& kv_lengths,
                                        int64_t q_slot, int64_t kv_slot) {
  CPF_CHECK(q_lengths.size() == kv_lengths.size(),
            "SequenceInfo: q and kv need one length per sequence each: q_lengths=", q_lengths,
            " kv_lengths=", kv_lengths);
  SequenceInfo info;
  info.cu_seqlens_q = cumulative(q_lengths, "q_lengths");
  info.cu_seqlens_kv = cumulative(kv_lengths, "kv_lengths");
  info.cu_seqlens_q_padded = slot_offsets(q_lengths, q_slot, "q_lengths");
  info.cu_seqlens_kv_padded = slot_offsets(kv_lengths, kv_slot, "kv_lengths");
  info.max_seqlen_q = max_length(info.cu_seqlens_q);
  info.max_seqlen_kv = max_length(info.cu_seqlens_kv);
  info.check();
  return info;
}

SequenceInfo SequenceInfo::from_lengths(const std::vector<int64_t>& lengths, int64_t slot) {
  return from_lengths(lengths, lengths, slot, slot);
}

SequenceInfo SequenceInfo::from_cu_seqlens(const std::vector<int64_t>& cu_seqlens_q,
                                           const std::vector<int64_t>& cu_seqlens_kv,
                                           const std::vector<int64_t>& cu_seqlens_q_padded,
                                           const std::vector<int64_t>& cu_seqlens_kv_padded) {
  CPF_CHECK(
      !cu_seqlens_q.empty() && cu_seqlens_q.size() == cu_seqlens_kv.size(),
      "SequenceInfo: cu_seqlens_q and cu_seqlens_kv must be non-empty and describe the same number of sequences: ",
      "cu_seqlens_q=", cu_seqlens_q, " cu_seqlens_kv=", cu_seqlens_kv);
  SequenceInfo info;
  info.cu_seqlens_q = cu_seqlens_q;
  info.cu_seqlens_kv = cu_seqlens_kv;
  info.cu_seqlens_q_padded = cu_seqlens_q_padded.empty() ? cu_seqlens_q : cu_seqlens_q_padded;
  info.cu_seqlens_kv_padded = cu_seqlens_kv_padded.empty() ? cu_seqlens_kv : cu_seqlens_kv_padded;
  info.max_seqlen_q = max_length(info.cu_seqlens_q);
  info.max_seqlen_kv = max_length(info.cu_seqlens_kv);
  info.check();
  return info;
}

SequenceInfo SequenceInfo::from_cu_seqlens(const std::vector<int64_t>& cu_seqlens,
                                           const std::vector<int64_t>& cu_seqlens_padded) {
  return from_cu_seqlens(cu_seqlens, cu_seqlens, cu_seqlens_padded, cu_seqlens_padded);
}

SequenceInfo SequenceInfo::with_position_offsets(int64_t q_offset, int64_t kv_offset) const {
  const size_t n = static_cast<size_t>(num_sequences());
  return with_position_offsets(std::vector<int64_t>(n, q_offset), std::vector<int64_t>(n, kv_offset));
}

SequenceInfo SequenceInfo::with_position_offsets(const std::vector<int64_t>& q_offsets,
                                                 const std::vector<int64_t>& kv_offsets) const {
  check();
  CPF_CHECK(static_cast<int64_t>(q_offsets.size()) == num_sequences() &&
                static_cast<int64_t>(kv_offsets.size()) == num_sequences(),
            "SequenceInfo: need one position offset per sequence (", num_sequences(), "): q_offsets=", q_offsets,
            " kv_offsets=", kv_offsets);
  SequenceInfo info = *this;
  info.q_positions = slot_positions(cu_seqlens_q_padded, q_offsets);
  info.kv_positions = slot_positions(cu_seqlens_kv_padded, kv_offsets);
  return info;
}

SequenceInfo SequenceInfo::with_positions(std::vector<int64_t> q_pos, std::vector<int64_t> kv_pos) const {
  SequenceInfo info = *this;
  info.q_positions = std::move(q_pos);
  info.kv_positions = std::move(kv_pos);
  info.check();
  return info;
}

void SequenceInfo::check() const {
  CPF_CHECK(cu_seqlens_q.size() == cu_seqlens_kv.size(),
            "SequenceInfo: cu_seqlens_q and cu_seqlens_kv describe different numbers of sequences: cu_seqlens_q=",
            cu_seqlens_q, " cu_seqlens_kv=", cu_seqlens_kv);
  check_side(cu_seqlens_q, cu_seqlens_q_padded, max_seqlen_q, q_positions, "q");
  check_side(cu_seqlens_kv, cu_seqlens_kv_padded, max_seqlen_kv, kv_positions, "kv");
}

std::string SequenceInfo::str() const {
  auto fmt = [](const std::vector<int64_t>& v) { return str_cat(v); };
  return str_cat("SequenceInfo(sequences=", num_sequences(), ", cu_seqlens_q=", fmt(cu_seqlens_q),
                 ", cu_seqlens_kv=", fmt(cu_seqlens_kv), ", cu_seqlens_q_padded=", fmt(cu_seqlens_q_padded),
                 ", cu_seqlens_kv_padded=", fmt(cu_seqlens_kv_padded), ", max_seqlen_q=", max_seqlen_q,
                 ", max_seqlen_kv=", max_seqlen_kv, q_positions.empty() ? "" : ", q_positions set",
                 kv_positions.empty() ? "" : ", kv_positions set", ")");
}

}  // namespace cpf
