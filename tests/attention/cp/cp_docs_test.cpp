// docs/cp.md's support matrix is the one unsupported_reason() implements: regenerate it with
//   build/<preset>/tests/cp_cp_docs_test --print
// and paste it between the markers.
#include <gtest/gtest.h>

#include <iostream>
#include <string>

#include "attention/cp/cp_support.h"

namespace cpf::cp {
namespace {

std::string docs_table() {
  // Embedded at build time (tests/CMakeLists.txt): the test runs from any folder.
  const std::string s =
#include "cp_md.inc"
      ;
  const std::string begin = "<!-- support-matrix:begin -->\n", end = "<!-- support-matrix:end -->";
  const auto b = s.find(begin), e = s.find(end);
  if (b == std::string::npos || e == std::string::npos) return "(markers not found in docs/cp.md)";
  return s.substr(b + begin.size(), e - b - begin.size());
}

TEST(CpDocs, SupportMatrixMatchesCheck) {
  EXPECT_EQ(docs_table(), support_matrix_markdown()) << "regenerate docs/cp.md's table (see this file's header)";
}

TEST(CpDocs, EveryStrategyRejectsOnlyWithAReason) {
  const std::string table = support_matrix_markdown();
  EXPECT_NE(table.find("| cross-attention | no: p2p: cross-attention"), std::string::npos) << table;
  EXPECT_NE(table.find("no: a2a: num_heads=6 is not divisible by the cp size=4"), std::string::npos) << table;
}

}  // namespace
}  // namespace cpf::cp

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--print") {
    std::cout << cpf::cp::support_matrix_markdown();
    return 0;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
