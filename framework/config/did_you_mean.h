#pragma once
// "Did you mean ...?" for a mistyped name: the closest candidate by edit distance, when it is close
// enough to be a typo rather than a different word. Used for config keys, CLI commands and options.
#include <optional>
#include <string>
#include <vector>

namespace cpf::config {

// Levenshtein distance with adjacent transpositions counted as one edit ("stpes" -> "steps" is 1).
size_t edit_distance(const std::string& a, const std::string& b);

// The candidate nearest to `typed`, if its distance is at most max(1, typed.size() / 3) (capped at 3)
// and no other candidate is equally near (an ambiguous guess is worse than none).
std::optional<std::string> closest_match(const std::string& typed, const std::vector<std::string>& candidates);

// "; did you mean 'X'?" or "" when nothing is close: appended to an error message.
std::string did_you_mean_suffix(const std::string& typed, const std::vector<std::string>& candidates);

}  // namespace cpf::config
