#include "attention/cuda/cudnn_sdpa_mapping.h"

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

// Chooses the band masks from the positions; returns a reason when cuDNN cannot express them.
std::string choose_band(const AttentionProblem& p, SdpaMapping& m, std::vector<int64_t>& offsets) {
  const int64_t left = p.window.left, right = p.window.right;
  if (left < 0 && right < 0) return "";  // positions do not matter: every key of the sequence is visible
  offsets.resize(static_cast<size_t>(m.b));
  for (int64_t i = 0; i < m.b; ++i) {
    const auto n = static_cast<size_t>(i);
    const int64_t q0 = m.q_token[n], k0 = m.kv_token[n];
    if (!contiguous_run(p.q_pos, q0, m.seq_len_q[n]) || !contiguous_run(p.kv_pos, k0, m.seq_len_kv[n])) {
      return concat("the positions of sequence ", i, " are not one contiguous run (cuDNN's masks are index based)");
    }
    offsets[n] = p.q_pos[static_cast<size_t>(q0)] - p.kv_pos[static_cast<size_t>(k0)];
  }
  // Which bounds hide anything: the right one hides keys from row 0, the left one from the last row.
  for (int64_t i = 0; i < m.b; ++i) {
    const auto n = static_cast<size_t>(i);
    if (right >= 0 && offsets[n] + right < m.seq_len_kv[n] - 1) m.right_bound = true;
    if (left >= 0 && m.seq_len_q[n] - 1 + offsets[n] - left > 0) m.left_bound = true;
  }
  if (!m.right_bound && !m.left_bound) return "";
  bool top_left = true, bottom_right = true;
  for (int64_t i = 1; i < m.b; ++i) {
    const auto n = static_cast<size_t>(i);
    top_left = top_left && offsets[n] == offsets[0];
    bottom_right = bottom_right && offsets[n] - (m.seq_len_kv[n] - m.seq_len_q[n]) ==
                                       offsets[0] - (m.seq_len_kv[0] - m.seq_len_q[0]);
  }
  int64_t c = 0;
  if (top_left) {
    c = offsets[0];
  } else if (bottom_right) {
    c = offsets[0] - (m.seq_len_kv[0] - m.seq_len_q[0]);
    m.bottom_right = true;
    m.padding = true;
  } else {
    const auto last = offsets.size() - 1;
    return concat("per-sequence position offsets differ (q0 - k0 = ", offsets[0], " for sequence 0, ",
                  offsets[last], " for sequence ", last, ") and are not bottom-right aligned");
  }
  // Top-left w is a FLOAT scalar (exact below 2^24); the rest is INT32 index arithmetic.
  const int64_t limit = m.bottom_right ? std::numeric_limits<int32_t>::max() / 2 : (int64_t{1} << 24);
  m.right = c + right;
  m.left = left - c + 1;
  if ((m.right_bound && std::abs(m.right) > limit) || (m.left_bound && std::abs(m.left) > limit)) {
    return concat("the mask's diagonal offset ", c, " is too large for cuDNN's index arithmetic");
  }
  return "";
}

// Marks the tokens whose results cuDNN leaves undefined (SdpaMapping::q_undefined).
void mark_undefined(const AttentionProblem& p, SdpaMapping& m, const std::vector<int64_t>& offsets) {
  const int64_t q_tokens = p.batch * p.s_q, kv_tokens = p.batch * p.s_kv;
  std::vector<uint8_t> q_undefined(static_cast<size_t>(q_tokens), 1), kv_undefined(static_cast<size_t>(kv_tokens), 1);
  const int64_t left = p.window.left, right = p.window.right;
  for (int64_t i = 0; i < m.b; ++i) {
    const auto n = static_cast<size_t>(i);
    const int64_t q_len = m.seq_len_q[n], kv_len = m.seq_len_kv[n];
    std::fill_n(kv_undefined.begin() + m.kv_token[n], kv_len, uint8_t{0});
    for (int64_t row = 0; row < q_len; ++row) {
      bool sees_a_key = true;
      if (!offsets.empty()) {
        const int64_t lo = left < 0 ? 0 : std::max<int64_t>(0, row + offsets[n] - left);
        const int64_t hi = right < 0 ? kv_len - 1 : std::min<int64_t>(kv_len - 1, row + offsets[n] + right);
        sees_a_key = lo <= hi;
      }
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
  std::vector<int64_t> offsets;  // q0 - k0 per cuDNN entry, when a window bounds the keys
  m.reason = choose_band(p, m, offsets);
  if (!m.reason.empty()) return m;
  mark_undefined(p, m, offsets);
  return m;
}

}  // namespace cpf::attention_cuda::cudnn
