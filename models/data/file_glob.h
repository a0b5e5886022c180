#pragma once
// File patterns for data paths: "data/fineweb_train_*.bin", "corpus/part-??.txt", or a plain path.
// Wildcards ('*' any run of characters, '?' one character) are allowed in the file-name part only, which
// keeps the expansion a single directory listing and its result easy to predict.
#include <string>
#include <string_view>
#include <vector>
#include "models/data/deprecated_namespace.h"

namespace cpf::models::data {

// True when `name` matches `pattern` ('*' and '?' wildcards, everything else literal).
bool glob_match(std::string_view pattern, std::string_view name);

// The regular files matching `pattern`, sorted by path. A pattern without wildcards names one file,
// which must exist. `what` (e.g. "text source") starts every error message, each of which names the
// pattern: missing file, missing directory, a wildcard in the directory part, no match.
std::vector<std::string> expand_file_pattern(const std::string& pattern, const std::string& what);

}  // namespace cpf::models::data
