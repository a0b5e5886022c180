#include "framework/config/did_you_mean.h"

#include <algorithm>

namespace cpf::config {

size_t edit_distance(const std::string& a, const std::string& b) {
  // Optimal string alignment: three rows of the dynamic programme.
  std::vector<size_t> before(b.size() + 1), prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) cur[j] = std::min(cur[j], before[j - 2] + 1);
    }
    before.swap(prev);
    prev.swap(cur);
  }
  return prev[b.size()];
}

std::optional<std::string> closest_match(const std::string& typed, const std::vector<std::string>& candidates) {
  const size_t limit = std::min<size_t>(3, std::max<size_t>(1, typed.size() / 3));
  std::optional<std::string> best;
  size_t best_distance = limit + 1;
  bool tie = false;
  for (const auto& c : candidates) {
    if (c == typed) continue;
    const size_t d = edit_distance(typed, c);
    if (d < best_distance) {
      best = c;
      best_distance = d;
      tie = false;
    } else if (d == best_distance && best && *best != c) {
      tie = true;
    }
  }
  if (tie) return std::nullopt;
  return best;
}

std::string did_you_mean_suffix(const std::string& typed, const std::vector<std::string>& candidates) {
  const auto match = closest_match(typed, candidates);
  return match ? "; did you mean '" + *match + "'?" : std::string();
}

}  // namespace cpf::config
