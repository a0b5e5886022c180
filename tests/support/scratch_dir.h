#pragma once
// A fresh, empty folder per test under the system temp dir: <temp>/<root>/<suite>.<test>.<name>. Tests
// that write run folders, checkpoints or files use it, so reruns start clean and tests never share one.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

namespace cpf::testing {

inline std::filesystem::path scratch_dir(const std::string& name, const std::string& root = "cpformer_tests") {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string test = info ? std::string(info->test_suite_name()) + "." + info->name() : "no_test";
  std::filesystem::path dir = std::filesystem::temp_directory_path() / root / (test + "." + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace cpf::testing
