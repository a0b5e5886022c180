#include "attention/cuda/cudnn/problem_mapping.h"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <sstream>

namespace cpf::attention_cuda::cudnn {
namespace {

template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// thd's s dims are rounded up so that one plan serves many batches of similar lengths (the padding
// mask hides the rest), and a multiple of 128 never hits the s_kv % 128 == 64 backward bug.
constexpr int64_t kThdLengthQuantum = 128;
int64_t round_up(int64_t n, int64_t quantum) { return (n + quantum - 1) / quantum * quantum; }

// True when positions[first .. first+len) are start, start+1, ...
bool contiguous_run(const std::vector<int64_t>& positions, int64_t first, int64_t len) {
  for (int64_t i = 1; i < len; ++i) {
    if (positions[static_cast<size_t>(first + i)] != positions[static_cast<size_t>(first)] + i) return false;
  }
  return true;
}

// Fills the cuDNN batch entries; returns a reason when the storage does not fit cuDNN's layouts.
std::string collect_sequences(const AttentionProblem& p, SdpaMapping& m) {
  const bool thd = p.format == QkvFormat::thd;
  if (!thd && static_cast<int64_t>(p.sequences.size()) != p.batch) {
    return concat("the call has ", p.sequences.size(), " sequences in ", p.batch,
                  " batch rows (cuDNN's bshd/sbhd form needs exactly one per row)");
  }
  for (size_t n = 0; n < p.sequences.size(); ++n) {
    const AttentionSequence& s = p.sequences[n];
    if (thd) {
      if (s.q_len == 0 || s.kv_len == 0) continue;  // no work; its tokens are fixed up afterwards
    } else {
      if (s.q_row != static_cast<int64_t>(n) || s.q_col != 0 || s.kv_col != 0) {
        return concat("sequence ", n, " does not start at index 0 of batch row ", n, " (q row ", s.q_row, " col ",
                      s.q_col, ", kv col ", s.kv_col, "): cuDNN's padding mask counts from index 0");
      }
      if (s.q_len == 0 || s.kv_len == 0) {
        return concat("batch row ", n, " has ", s.q_len, " queries and ", s.kv_len,
                      " keys (cuDNN's bshd/sbhd form needs at least one of each)");
      }
    }
    if (s.q_len > std::numeric_limits<int32_t>::max() || s.kv_len > std::numeric_limits<int32_t>::max()) {
      return concat("sequence ", n, " is longer than 2^31 tokens");
    }
    m.seq_len_q.push_back(static_cast<int32_t>(s.q_len));
    m.seq_len_kv.push_back(static_cast<int32_t>(s.kv_len));
    m.q_token.push_back(s.q_token);
    m.kv_token.push_back(s.kv_token);
  }
  m.b = static_cast<int64_t>(m.seq_len_q.size());
  if (m.b == 0) return "no sequence has both queries and keys";
  if (thd) {
    const int64_t max_q = *std::max_element(m.seq_len_q.begin(), m.seq_len_q.end());
    const int64_t max_kv = *std::max_element(m.seq_len_kv.begin(), m.seq_len_kv.end());
    m.s_q = round_up(max_q, kThdLengthQuantum);
    m.s_kv = round_up(max_kv, kThdLengthQuantum);
    m.ragged = true;
    m.padding = true;
  } else {
    m.s_q = p.s_q;
    m.s_kv = p.s_kv;
    for (int64_t i = 0; i < m.b; ++i) {
      if (m.seq_len_q[static_cast<size_t>(i)] != p.s_q || m.seq_len_kv[static_cast<size_t>(i)] != p.s_kv) {
        m.padding = true;
      }
    }
  }
  if (m.s_kv % 128 == 64) m.padding = true;  // the Hopper backward NaN guard (header comment)
  return "";
}

constexpr int64_t kUnbounded = std::numeric_limits<int64_t>::max();

// The keys each query row of one cuDNN entry sees, as index intervals [lo, hi] within the entry
// (lo > hi: none). Exact for any positions as long as the keys' positions increase (then every row's
// visible keys are one interval, found by binary search).
struct RowIntervals {
  std::vector<int64_t> lo, hi;
};

std::string row_intervals(const AttentionProblem& p, const SdpaMapping& m, size_t n, RowIntervals& r) {
  const int64_t left = p.window.left, right = p.window.right;
  const int64_t q_len = m.seq_len_q[n], kv_len = m.seq_len_kv[n];
  const int64_t* kp = p.kv_pos.data() + m.kv_token[n];
  for (int64_t j = 1; j < kv_len; ++j) {
    if (kp[j] <= kp[j - 1]) {
      return concat("the key positions of sequence ", n, " do not increase (", kp[j - 1], " then ", kp[j],
                    "; cuDNN's masks are index based)");
    }
  }
  r.lo.resize(static_cast<size_t>(q_len));
  r.hi.resize(static_cast<size_t>(q_len));
  const int64_t* qp = p.q_pos.data() + m.q_token[n];
  if (contiguous_run(p.q_pos, m.q_token[n], q_len) && contiguous_run(p.kv_pos, m.kv_token[n], kv_len)) {
    // The common case (no CP, or a CP tile of one chunk each): the intervals follow arithmetically.
    const int64_t c = qp[0] - kp[0];
    for (int64_t row = 0; row < q_len; ++row) {
      r.lo[static_cast<size_t>(row)] = left < 0 ? 0 : std::max<int64_t>(0, row + c - left);
      r.hi[static_cast<size_t>(row)] = right < 0 ? kv_len - 1 : std::min<int64_t>(kv_len - 1, row + c + right);
    }
    return "";
  }
  for (int64_t row = 0; row < q_len; ++row) {
    const int64_t pq = qp[row];
    r.lo[static_cast<size_t>(row)] = left < 0 ? 0 : std::lower_bound(kp, kp + kv_len, pq - left) - kp;
    r.hi[static_cast<size_t>(row)] = right < 0 ? kv_len - 1 : (std::upper_bound(kp, kp + kv_len, pq + right) - kp) - 1;
  }
  return "";
}

// thd: narrows entry n to the queries that see a key and the keys some query sees (leading and trailing
// ones), so that a ring tile whose first query half or second key half is hidden becomes a plain
// block. Returns false when nothing of the entry is visible.
bool trim_to_visible(SdpaMapping& m, size_t n, RowIntervals& r) {
  const auto q_len = static_cast<int64_t>(r.lo.size());
  int64_t first = 0, last = q_len - 1;
  while (first < q_len && r.lo[static_cast<size_t>(first)] > r.hi[static_cast<size_t>(first)]) ++first;
  if (first == q_len) return false;
  while (r.lo[static_cast<size_t>(last)] > r.hi[static_cast<size_t>(last)]) --last;
  int64_t k_first = kUnbounded, k_last = -1;
  for (int64_t row = first; row <= last; ++row) {
    const auto i = static_cast<size_t>(row);
    if (r.lo[i] > r.hi[i]) continue;
    k_first = std::min(k_first, r.lo[i]);
    k_last = std::max(k_last, r.hi[i]);
  }
  RowIntervals t;
  for (int64_t row = first; row <= last; ++row) {
    t.lo.push_back(r.lo[static_cast<size_t>(row)] - k_first);
    t.hi.push_back(r.hi[static_cast<size_t>(row)] - k_first);
  }
  r = std::move(t);
  m.q_token[n] += first;
  m.kv_token[n] += k_first;
  m.seq_len_q[n] = static_cast<int32_t>(last - first + 1);
  m.seq_len_kv[n] = static_cast<int32_t>(k_last - k_first + 1);
  return true;
}

// Admissible values of one band constant: [min, max], max = kUnbounded when any larger value works.
struct Admissible {
  int64_t min = std::numeric_limits<int64_t>::min(), max = kUnbounded;
  bool empty() const { return min > max; }
  void intersect(const Admissible& o) {
    min = std::max(min, o.min);
    max = std::min(max, o.max);
  }
  Admissible shifted(int64_t by) const {
    return {min == std::numeric_limits<int64_t>::min() ? min : min + by, max == kUnbounded ? max : max + by};
  }
};

// For one entry: the top-left constants cr (hi = min(kv_len - 1, row + cr)) and cl (lo = max(0, row -
// cl)) that reproduce every visible row's interval.
void admissible_constants(const RowIntervals& r, int64_t kv_len, Admissible& cr, Admissible& cl) {
  for (size_t row = 0; row < r.lo.size(); ++row) {
    if (r.lo[row] > r.hi[row]) continue;  // checked against the chosen band afterwards
    const auto i = static_cast<int64_t>(row);
    if (r.hi[row] < kv_len - 1) {
      cr.intersect({r.hi[row] - i, r.hi[row] - i});
    } else {
      cr.intersect({kv_len - 1 - i, kUnbounded});
    }
    if (r.lo[row] > 0) {
      cl.intersect({i - r.lo[row], i - r.lo[row]});
    } else {
      cl.intersect({i, kUnbounded});
    }
  }
}

// Trims every thd entry to its visible queries and keys and drops the entries left empty, so the
// sequence lengths, token starts and `rows` stay aligned; false when no entry is left.
bool keep_visible_entries(SdpaMapping& m, std::vector<RowIntervals>& rows) {
  size_t kept = 0;
  for (size_t n = 0; n < rows.size(); ++n) {
    if (!trim_to_visible(m, n, rows[n])) continue;
    if (kept != n) {  // (a vector moved onto itself would be emptied)
      m.seq_len_q[kept] = m.seq_len_q[n];
      m.seq_len_kv[kept] = m.seq_len_kv[n];
      m.q_token[kept] = m.q_token[n];
      m.kv_token[kept] = m.kv_token[n];
      rows[kept] = std::move(rows[n]);
    }
    ++kept;
  }
  if (kept == 0) return false;
  m.seq_len_q.resize(kept);
  m.seq_len_kv.resize(kept);
  m.q_token.resize(kept);
  m.kv_token.resize(kept);
  rows.resize(kept);
  m.b = static_cast<int64_t>(kept);
  m.s_q = round_up(*std::max_element(m.seq_len_q.begin(), m.seq_len_q.end()), kThdLengthQuantum);
  m.s_kv = round_up(*std::max_element(m.seq_len_kv.begin(), m.seq_len_kv.end()), kThdLengthQuantum);
  return true;
}

// Chooses the band masks from the positions (trimming thd entries first); returns a reason when cuDNN
// cannot express them. Fills `rows` with every entry's row intervals for mark_undefined.
std::string choose_band(const AttentionProblem& p, SdpaMapping& m, std::vector<RowIntervals>& rows) {
  rows.assign(static_cast<size_t>(m.b), {});
  if (p.window.left < 0 && p.window.right < 0) return "";  // positions do not matter: every key is visible
  for (size_t n = 0; n < rows.size(); ++n) {
    if (std::string reason = row_intervals(p, m, n, rows[n]); !reason.empty()) return reason;
  }
  if (m.ragged && !keep_visible_entries(m, rows)) return "no query sees a key";
  // Top-left: one (cr, cl) for every entry. Bottom-right: cuDNN adds kv_len - q_len to the diagonal.
  Admissible tl_r, tl_l, br_r, br_l;
  for (size_t n = 0; n < rows.size(); ++n) {
    Admissible cr, cl;
    admissible_constants(rows[n], m.seq_len_kv[n], cr, cl);
    const int64_t shift = m.seq_len_kv[n] - m.seq_len_q[n];
    tl_r.intersect(cr);
    tl_l.intersect(cl);
    br_r.intersect(cr.shifted(-shift));
    br_l.intersect(cl.shifted(shift));
  }
  Admissible cr = tl_r, cl = tl_l;
  if (tl_r.empty() || tl_l.empty()) {
    if (br_r.empty() || br_l.empty()) {
      return "the visible keys of the queries are not one band with the same diagonal in every sequence "
             "(cuDNN's masks are index based)";
    }
    cr = br_r;
    cl = br_l;
    m.bottom_right = true;
    m.padding = true;
  }
  m.right_bound = cr.max != kUnbounded;
  m.left_bound = cl.max != kUnbounded;
  if (!m.right_bound && !m.left_bound) {
    m.bottom_right = false;
  }
  // Rows that see no key must see none under the chosen band too.
  for (size_t n = 0; n < rows.size(); ++n) {
    const int64_t kv_len = m.seq_len_kv[n];
    const int64_t shift = m.bottom_right ? kv_len - m.seq_len_q[n] : 0;
    for (size_t row = 0; row < rows[n].lo.size(); ++row) {
      if (rows[n].lo[row] <= rows[n].hi[row]) continue;
      const auto i = static_cast<int64_t>(row);
      const int64_t hi = m.right_bound ? std::min(kv_len - 1, i + cr.max + shift) : kv_len - 1;
      const int64_t lo = m.left_bound ? std::max<int64_t>(0, i - cl.max + shift) : 0;
      if (lo <= hi) {
        return concat("query ", row, " of sequence ", n, " sees no key, but cuDNN's band would show it keys ", lo, "..",
                      hi);
      }
    }
  }
  // cuDNN builds a left bound with s_q > s_kv only in the padding form.
  if (m.left_bound && m.s_q > m.s_kv) m.padding = true;
  // Top-left w is a FLOAT scalar (exact below 2^24); the rest is INT32 index arithmetic.
  const int64_t limit = m.bottom_right ? std::numeric_limits<int32_t>::max() / 2 : (int64_t{1} << 24);
  m.right = m.right_bound ? cr.max : 0;
  m.left = m.left_bound ? cl.max + 1 : 0;
  if (std::abs(m.right) > limit || std::abs(m.left) > limit) {
    return concat("the mask's diagonal offset (right ", m.right, ", left ", m.left,
                  ") is too large for cuDNN's index arithmetic");
  }
  return "";
}

// Marks the tokens whose results cuDNN leaves undefined (SdpaMapping::q_undefined).
void mark_undefined(const AttentionProblem& p, SdpaMapping& m, const std::vector<RowIntervals>& rows) {
  const int64_t q_tokens = p.batch * p.s_q, kv_tokens = p.batch * p.s_kv;
  std::vector<uint8_t> q_undefined(static_cast<size_t>(q_tokens), 1), kv_undefined(static_cast<size_t>(kv_tokens), 1);
  for (int64_t i = 0; i < m.b; ++i) {
    const auto n = static_cast<size_t>(i);
    const int64_t q_len = m.seq_len_q[n], kv_len = m.seq_len_kv[n];
    std::fill_n(kv_undefined.begin() + m.kv_token[n], kv_len, uint8_t{0});
    for (int64_t row = 0; row < q_len; ++row) {
      const auto r = static_cast<size_t>(row);
      const bool sees_a_key = rows[n].lo.empty() || rows[n].lo[r] <= rows[n].hi[r];
      q_undefined[static_cast<size_t>(m.q_token[n] + row)] = sees_a_key ? 0 : 1;
      if (!sees_a_key) m.any_fully_masked_row = true;
    }
  }
  if (std::find(q_undefined.begin(), q_undefined.end(), 1) != q_undefined.end()) m.q_undefined = std::move(q_undefined);
  if (std::find(kv_undefined.begin(), kv_undefined.end(), 1) != kv_undefined.end()) {
    m.kv_undefined = std::move(kv_undefined);
  }
}

}  // namespace

SdpaMapping map_to_cudnn(const AttentionProblem& p) {
  SdpaMapping m;
  m.reason = collect_sequences(p, m);
  if (!m.reason.empty()) return m;
  std::vector<RowIntervals> rows;  // per cuDNN entry, when a window bounds the keys
  m.reason = choose_band(p, m, rows);
  if (!m.reason.empty()) return m;
  mark_undefined(p, m, rows);
  return m;
}

}  // namespace cpf::attention_cuda::cudnn
