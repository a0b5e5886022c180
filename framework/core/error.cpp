#include "framework/core/error.h"

#include <cstring>

namespace cpf {
namespace {

// The source root this library was compiled from, derived from this file's own path ("" when
// __FILE__ is not the usual .../framework/core/error.cpp).
const std::string& project_root() {
  static const std::string root = [] {
    const std::string self = __FILE__;
    const std::string suffix = "framework/core/error.cpp";
    if (self.size() < suffix.size() || self.compare(self.size() - suffix.size(), suffix.size(), suffix) != 0) {
      return std::string();
    }
    return self.substr(0, self.size() - suffix.size());
  }();
  return root;
}

// Paths are reported relative to the project so messages do not depend on the build machine.
std::string short_path(const std::string& file) {
  const std::string& root = project_root();
  if (!root.empty() && file.size() > root.size() && file.compare(0, root.size(), root) == 0) {
    return file.substr(root.size());
  }
  // Compiled elsewhere (an installed copy): fall back to the first project folder in the path.
  for (const char* root : {"framework/", "attention/", "models/", "apps/", "tests/", "benchmarks/"}) {
    const auto pos = file.rfind(root);
    if (pos != std::string::npos) return file.substr(pos);
  }
  return file;
}

std::string compose(const std::string& file, int line, const std::string& condition, const std::string& message) {
  std::string out = message.empty() ? "check failed" : message;
  out += " [" + file + ":" + std::to_string(line);
  if (!condition.empty()) out += ": " + condition;
  out += "]";
  return out;
}

}  // namespace

Error::Error(std::string file, int line, std::string condition, std::string message)
    : std::runtime_error(compose(short_path(file), line, condition, message)),
      file_(short_path(file)),
      line_(line),
      condition_(std::move(condition)),
      message_(std::move(message)) {}

std::string shape_str(const std::vector<int64_t>& shape) { return str_cat(shape); }

namespace detail {
void throw_error(const char* file, int line, const char* condition, std::string message) {
  throw Error(file, line, condition, std::move(message));
}
}  // namespace detail

}  // namespace cpf
