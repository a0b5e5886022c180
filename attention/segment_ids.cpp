// SequenceInfo::from_segment_ids: sequence metadata from per-token segment ids and positions (JAX's
// SequenceDescriptor.from_segment_ids_and_pos), derived exactly: a token counts only when it sees,
// or is seen by, a token of the same segment on the other side under the mask and window.
#include <algorithm>
#include <limits>
#include <map>

#include "attention/mask.h"
#include "attention/sequence_info.h"
#include "framework/core/error.h"

namespace cpf {
namespace {

constexpr const char* kOp = "SequenceInfo::from_segment_ids";

struct Run {
  int64_t id = 0;
  int64_t begin = 0;  // index within the row
  int64_t end = 0;
};

// One side (q or kv): ids and positions flattened to rows x len, positions broadcast over the rows.
struct Side {
  int64_t rows = 0;
  int64_t len = 0;
  std::vector<int64_t> ids;            // rows * len
  std::vector<int64_t> positions;      // rows * len
  std::vector<std::vector<Run>> runs;  // per row, in order
};

Side load_side(const Tensor& ids, const Tensor& pos, const char* side) {
  CPF_CHECK(ids.defined() && pos.defined(), kOp, ": ", side, " segment_ids and segment_pos must both be given");
  for (const Tensor* t : {&ids, &pos}) {
    CPF_CHECK(t->dtype() == DType::i32 || t->dtype() == DType::i64, kOp, ": ", side,
              " segment ids and positions must be i32 or i64: segment_ids ", ids.dtype(), " segment_pos ", pos.dtype());
  }
  const Shape& is = ids.shape();
  const Shape& ps = pos.shape();
  const bool trailing_match = !ps.empty() && is.size() >= ps.size() &&
                              std::equal(ps.begin(), ps.end(), is.end() - static_cast<int64_t>(ps.size()));
  CPF_CHECK(trailing_match, kOp, ": ", side, " segment_ids ", is, " and segment_pos ", ps,
            " do not match: segment_ids must have segment_pos's shape, optionally with extra leading batch dims");
  Side s;
  s.len = ps.back();
  s.rows = shape_numel(Shape(is.begin(), is.end() - 1));
  s.ids = ids.to_vector<int64_t>();
  const std::vector<int64_t> p = pos.to_vector<int64_t>();
  const int64_t pos_rows = shape_numel(Shape(ps.begin(), ps.end() - 1));
  s.positions.resize(s.ids.size());
  for (int64_t r = 0; r < s.rows; ++r) {
    std::copy_n(p.begin() + (r % pos_rows) * s.len, s.len, s.positions.begin() + r * s.len);
  }
  s.runs.resize(static_cast<size_t>(s.rows));
  for (int64_t r = 0; r < s.rows; ++r) {
    const int64_t* row = s.ids.data() + r * s.len;
    std::vector<Run>& runs = s.runs[r];
    for (int64_t i = 0; i < s.len; ++i) {
      CPF_CHECK(row[i] >= 0, kOp, ": ", side, " segment ids must be >= 0 (0 = padding): id ", row[i], " at row ", r,
                " token ", i);
      if (row[i] == 0) continue;
      if (!runs.empty() && runs.back().id == row[i] && runs.back().end == i) {
        runs.back().end = i + 1;
        continue;
      }
      for (const Run& prev : runs) {
        CPF_CHECK(prev.id != row[i], kOp, ": ", side, " segment ", row[i], " of row ", r, " is not contiguous (tokens ",
                  prev.end - 1, " and ", i, " are separated by other ids)");
      }
      runs.push_back({row[i], i, i + 1});
    }
  }
  return s;
}

// [first, last] indices (within `run`) of `mine` tokens that see some `other` token, given the
// visibility pq - lo_reach <= pk <= pq + hi_reach seen from `mine`. {-1, -1} when none does.
std::pair<int64_t, int64_t> visible_span(const int64_t* mine, int64_t count, std::vector<int64_t> other,
                                         int64_t lo_reach, int64_t hi_reach) {
  std::sort(other.begin(), other.end());
  int64_t first = -1, last = -1;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t lo = lo_reach < 0 ? std::numeric_limits<int64_t>::min() : mine[i] - lo_reach;
    const int64_t hi = hi_reach < 0 ? std::numeric_limits<int64_t>::max() : mine[i] + hi_reach;
    const auto it = std::lower_bound(other.begin(), other.end(), lo);
    if (it != other.end() && *it <= hi) {
      if (first < 0) first = i;
      last = i;
    }
  }
  return {first, last};
}

void check_whole_rows(const Side& s, MaskType mask, const char* side) {
  for (int64_t r = 0; r < s.rows; ++r) {
    const auto& runs = s.runs[r];
    const bool whole = runs.size() == 1 && runs[0].begin == 0 && runs[0].end == s.len;
    CPF_CHECK(whole || s.len == 0, kOp, ": mask ", mask_type_name(mask),
              " on bshd/sbhd treats every token of a row as one sequence, but ", side, " row ", r,
              " has padding or several segments; use a padding mask (or thd to pack sequences)");
  }
}

}  // namespace

SequenceInfo SequenceInfo::from_segment_ids(const AttentionSpec& spec, const Tensor& q_segment_ids,
                                            const Tensor& q_segment_pos, const Tensor& kv_segment_ids,
                                            const Tensor& kv_segment_pos) {
  const AttentionWindow window = effective_window(spec);
  const Side q = load_side(q_segment_ids, q_segment_pos, "q");
  const Side kv = load_side(kv_segment_ids, kv_segment_pos, "kv");
  CPF_CHECK(q.rows == kv.rows, kOp, ": q and kv must have the same rows: q segment_ids ", q_segment_ids.shape(),
            " kv segment_ids ", kv_segment_ids.shape());
  const bool rows_format = spec.qkv_format != QkvFormat::thd;
  const bool whole_rows = rows_format && !is_padding(spec.mask);
  if (whole_rows) {
    check_whole_rows(q, spec.mask, "q");
    check_whole_rows(kv, spec.mask, "kv");
  }

  SequenceInfo info;
  info.cu_seqlens_q_padded.clear();
  info.cu_seqlens_kv_padded.clear();
  for (int64_t r = 0; r < q.rows; ++r) {
    if (whole_rows) {
      info.cu_seqlens_q_padded.push_back(r * q.len);
      info.cu_seqlens_kv_padded.push_back(r * kv.len);
      info.cu_seqlens_q.push_back(info.cu_seqlens_q.back() + q.len);
      info.cu_seqlens_kv.push_back(info.cu_seqlens_kv.back() + kv.len);
      continue;
    }
    CPF_CHECK(!rows_format || (q.runs[r].size() <= 1 && kv.runs[r].size() <= 1), kOp,
              ": bshd/sbhd hold at most one sequence per row, but row ", r, " has ", q.runs[r].size(), " q and ",
              kv.runs[r].size(), " kv segments; pack several sequences per row with thd");
    std::map<int64_t, const Run*> kv_by_id;
    for (const Run& run : kv.runs[r]) kv_by_id[run.id] = &run;
    int64_t previous_kv_end = 0;
    for (const Run& qr : q.runs[r]) {
      const auto found = kv_by_id.find(qr.id);
      if (found == kv_by_id.end()) continue;  // nothing to attend: every query of the segment is masked
      const Run& kr = *found->second;
      CPF_CHECK(kr.begin >= previous_kv_end, kOp, ": segments must appear in the same order on q and kv, but row ", r,
                " has segment ", qr.id, " earlier on q than on kv");
      previous_kv_end = kr.end;
      const int64_t* pq = q.positions.data() + r * q.len + qr.begin;
      const int64_t* pk = kv.positions.data() + r * kv.len + kr.begin;
      const auto [q_first, q_last] = visible_span(
          pq, qr.end - qr.begin, std::vector<int64_t>(pk, pk + (kr.end - kr.begin)), window.left, window.right);
      if (q_first < 0) continue;  // no visible pair: no sequence
      const auto [k_first, k_last] = visible_span(
          pk, kr.end - kr.begin, std::vector<int64_t>(pq, pq + (qr.end - qr.begin)), window.right, window.left);
      info.cu_seqlens_q_padded.push_back(r * q.len + qr.begin + q_first);
      info.cu_seqlens_kv_padded.push_back(r * kv.len + kr.begin + k_first);
      info.cu_seqlens_q.push_back(info.cu_seqlens_q.back() + (q_last - q_first + 1));
      info.cu_seqlens_kv.push_back(info.cu_seqlens_kv.back() + (k_last - k_first + 1));
    }
  }
  info.cu_seqlens_q_padded.push_back(q.rows * q.len);
  info.cu_seqlens_kv_padded.push_back(kv.rows * kv.len);
  for (size_t n = 0; n + 1 < info.cu_seqlens_q.size(); ++n) {
    info.max_seqlen_q = std::max(info.max_seqlen_q, info.cu_seqlens_q[n + 1] - info.cu_seqlens_q[n]);
    info.max_seqlen_kv = std::max(info.max_seqlen_kv, info.cu_seqlens_kv[n + 1] - info.cu_seqlens_kv[n]);
  }
  info.q_positions = q.positions;
  info.kv_positions = kv.positions;
  info.check();
  return info;
}

SequenceInfo SequenceInfo::from_segment_ids(const AttentionSpec& spec, const Tensor& segment_ids,
                                            const Tensor& segment_pos) {
  return from_segment_ids(spec, segment_ids, segment_pos, segment_ids, segment_pos);
}

}  // namespace cpf
