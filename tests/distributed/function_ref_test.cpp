// FunctionRef (framework/distributed/nccl/function_ref.h): the allocation-free callback of the NCCL
// backend's posting path calls the callable it refers to, with its arguments, and returns its result.
#include "framework/distributed/nccl/function_ref.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace cpf::dist::nccl {
namespace {

int apply(FunctionRef<int(int, int)> f, int a, int b) { return f(a, b); }
void append(FunctionRef<void(std::vector<int>&)> f, std::vector<int>& out) { f(out); }

TEST(FunctionRef, CallsALambdaWithItsCaptures) {
  int calls = 0;
  const int offset = 10;
  EXPECT_EQ(apply([&](int a, int b) { return ++calls, a * b + offset; }, 3, 4), 22);
  EXPECT_EQ(apply([&](int a, int b) { return ++calls, a - b; }, 3, 4), -1);
  EXPECT_EQ(calls, 2);
}

TEST(FunctionRef, PassesReferencesThrough) {
  std::vector<int> out;
  append([](std::vector<int>& v) { v.push_back(7); }, out);
  append([](std::vector<int>& v) { v.push_back(8); }, out);
  EXPECT_EQ(out, (std::vector<int>{7, 8}));
}

TEST(FunctionRef, RefersToConstAndMutableCallables) {
  struct Counter {
    int n = 0;
    int operator()(int x) { return n += x; }
  };
  Counter counter;
  FunctionRef<int(int)> ref(counter);
  EXPECT_EQ(ref(2), 2);
  EXPECT_EQ(ref(3), 5);
  EXPECT_EQ(counter.n, 5);  // the callable itself, not a copy
  const auto square = [](int x) { return x * x; };
  EXPECT_EQ(FunctionRef<int(int)>(square)(9), 81);
  // A result convertible to the declared one.
  EXPECT_EQ(FunctionRef<std::string()>([] { return "text"; })(), "text");
}

}  // namespace
}  // namespace cpf::dist::nccl
