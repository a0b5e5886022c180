#pragma once
// Helpers for the cpformer CLI tests: run the CLI in-process with captured output, scratch folders,
// the repository root (configs/, docs/).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "apps/trainer/cli.h"

namespace cpf::trainer::testing {

struct CliResult {
  int code = -1;
  std::string out;
  std::string err;
};

inline CliResult run(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  CliResult r;
  r.code = run_cli(args, out, err, false);
  r.out = out.str();
  r.err = err.str();
  return r;
}

// The source tree (tests/CMakeLists.txt defines CPF_SOURCE_DIR for these tests).
inline std::filesystem::path repo_root() { return std::filesystem::path(CPF_SOURCE_DIR); }

// A fresh, empty folder under the system temp dir, unique per test.
inline std::filesystem::path scratch_dir(const std::string& name) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::filesystem::path dir = std::filesystem::temp_directory_path() / "cpformer_tests" /
                              (std::string(info->test_suite_name()) + "." + info->name() + "." + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

inline void write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace cpf::trainer::testing
