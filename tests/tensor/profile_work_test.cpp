// profile::add_work (framework/tensor/profile.h): the work an op reports goes to every scope open on its
// thread while recording, nothing when recording is off, and a GEMM reports 2 M N K and its operands' bytes.
#include <gtest/gtest.h>

#include <map>

#include "framework/tensor/ops/matmul.h"
#include "framework/tensor/profile.h"
#include "framework/tensor/tensor.h"

namespace cpf {
namespace {

std::map<std::string, profile::Stats> by_name() {
  std::map<std::string, profile::Stats> out;
  for (const profile::Stats& s : profile::snapshot()) out[s.name] = s;
  return out;
}

TEST(ProfileWork, GoesToEveryOpenScopeWhileRecording) {
  profile::reset();
  profile::add_work(1, 1);  // no scope open, recording off: nowhere to go
  profile::set_enabled(true);
  {
    const profile::Scope outer("phase/forward");
    {
      const profile::Scope inner("forward/linear");
      profile::add_work(100, 40);
    }
    profile::add_work(0, 8);  // the parent's own work
  }
  profile::set_enabled(false);
  {
    const profile::Scope off("forward/linear");
    profile::add_work(1000, 1000);  // not recording: not counted
  }
  auto rows = by_name();
  EXPECT_DOUBLE_EQ(rows["forward/linear"].flops, 100);
  EXPECT_DOUBLE_EQ(rows["forward/linear"].bytes, 40);
  EXPECT_DOUBLE_EQ(rows["phase/forward"].flops, 100);
  EXPECT_DOUBLE_EQ(rows["phase/forward"].bytes, 48);
  profile::reset();
}

TEST(ProfileWork, AGemmReportsTwoMnkAndItsBytes) {
  profile::reset();
  profile::set_enabled(true);
  {
    const profile::Scope scope("gemm");
    raw::matmul(zeros({2, 3, 5}), zeros({5, 7}));  // (2, 3, 5) @ (5, 7): 2 x 3 x 7 outputs of 5 products
  }
  profile::set_enabled(false);
  const profile::Stats s = by_name()["gemm"];
  EXPECT_DOUBLE_EQ(s.flops, 2.0 * 2 * 3 * 7 * 5);
  EXPECT_DOUBLE_EQ(s.bytes, 4.0 * (2 * 3 * 5 + 5 * 7 + 2 * 3 * 7));
  EXPECT_DOUBLE_EQ(profile::tensor_bytes(Tensor()), 0);
  profile::reset();
}

}  // namespace
}  // namespace cpf
