// cpf::Error and the CPF_CHECK family: message composition (values, shapes, location, condition),
// accessors, laziness; leveled logging and its CPF_LOG_LEVEL parsing.
#include "framework/core/error.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "framework/core/logging.h"

namespace cpf {
namespace {

std::string this_file() { return "tests/core/error_test.cpp"; }

TEST(Error, CheckComposesValuesShapesLocationAndCondition) {
  const int x = 2;
  const std::vector<int64_t> shape{4, 8};
  int line = 0;
  try {
    line = __LINE__ + 1;
    CPF_CHECK(x == 3, "op: value ", x, " with shape ", shape, " and ", 1.5, " / ", 'c');
    FAIL() << "CPF_CHECK did not throw";
  } catch (const Error& e) {
    const std::string expected_message = "op: value 2 with shape [4,8] and 1.5 / c";
    EXPECT_EQ(e.message(), expected_message);
    EXPECT_EQ(e.condition(), "x == 3");
    EXPECT_EQ(e.file(), this_file());
    EXPECT_EQ(e.line(), line);
    EXPECT_EQ(std::string(e.what()), expected_message + " [" + this_file() + ":" + std::to_string(line) + ": x == 3]");
  }
}

TEST(Error, IsARuntimeError) {
  try {
    CPF_CHECK(false, "plain");
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("plain ["), std::string::npos) << e.what();
  }
}

TEST(Error, FailHasNoCondition) {
  int line = 0;
  try {
    line = __LINE__ + 1;
    CPF_FAIL("unreachable: ", 7);
  } catch (const Error& e) {
    EXPECT_EQ(e.condition(), "");
    EXPECT_EQ(e.message(), "unreachable: 7");
    EXPECT_EQ(std::string(e.what()), "unreachable: 7 [" + this_file() + ":" + std::to_string(line) + "]");
  }
}

TEST(Error, EmptyMessageSaysCheckFailed) {
  try {
    CPF_CHECK(1 + 1 == 3);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.message(), "");
    EXPECT_EQ(std::string(e.what()).rfind("check failed [" + this_file(), 0), 0u) << e.what();
    EXPECT_NE(std::string(e.what()).find(": 1 + 1 == 3]"), std::string::npos) << e.what();
  }
}

TEST(Error, ValueFormatting) {
  EXPECT_EQ(shape_str({4, 8}), "[4,8]");
  EXPECT_EQ(shape_str({}), "[]");
  EXPECT_EQ(shape_str({7}), "[7]");
  EXPECT_EQ(shape_str({-1, 0, 3}), "[-1,0,3]");
  EXPECT_EQ(str_cat(true, " ", false), "true false");
  EXPECT_EQ(str_cat(std::vector<std::string>{"a", "b"}), "[a,b]");
  EXPECT_EQ(str_cat(std::vector<double>{0.5, 2}), "[0.5,2]");
  EXPECT_EQ(str_cat("x=", int64_t{-3}, " n=", size_t{12}), "x=-3 n=12");
  EXPECT_EQ(str_cat(), "");
}

TEST(Error, ConditionIsEvaluatedOnceAndMessageOnlyOnFailure) {
  int evaluations = 0, formatted = 0;
  auto cond = [&](bool v) {
    ++evaluations;
    return v;
  };
  auto expensive = [&] {
    ++formatted;
    return std::string("details");
  };
  CPF_CHECK(cond(true), "never ", expensive());
  EXPECT_EQ(evaluations, 1);
  EXPECT_EQ(formatted, 0);
  EXPECT_THROW(CPF_CHECK(cond(false), "now ", expensive()), Error);
  EXPECT_EQ(evaluations, 2);
  EXPECT_EQ(formatted, 1);
}

TEST(Error, MacroIsOneStatement) {
  // An unbraced if/else around CPF_CHECK must still parse as intended.
  int reached = 0;
  if (reached == 0)
    CPF_CHECK(true, "fine");
  else
    reached = 100;
  EXPECT_EQ(reached, 0);
}

TEST(Error, ProjectRelativePathsInMessages) {
  // The location never carries the build machine's absolute path.
  try {
    CPF_CHECK(false, "where");
  } catch (const Error& e) {
    EXPECT_EQ(e.file(), this_file());
    EXPECT_EQ(std::string(e.what()).find("/work/"), std::string::npos) << e.what();
  }
  // Paths outside the project are kept as given.
  const Error outside("/usr/include/foo.h", 3, "c", "m");
  EXPECT_EQ(outside.file(), "/usr/include/foo.h");
  EXPECT_EQ(std::string(outside.what()), "m [/usr/include/foo.h:3: c]");
}

// ---- logging ----

class LoggingTest : public ::testing::Test {
 protected:
  void SetUp() override { saved_ = log_level(); }
  void TearDown() override { set_log_level(saved_); }
  LogLevel saved_ = LogLevel::info;
};

TEST_F(LoggingTest, ThresholdFiltersMessages) {
  set_log_level(LogLevel::info);
  ::testing::internal::CaptureStderr();
  log_info("hello ", 3, " ", std::vector<int64_t>{2, 2});
  log_debug("hidden debug");
  log_warn("careful");
  std::string out = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(out.find("[cpformer info] hello 3 [2,2]\n"), std::string::npos) << out;
  EXPECT_NE(out.find("[cpformer warn] careful\n"), std::string::npos) << out;
  EXPECT_EQ(out.find("hidden debug"), std::string::npos) << out;

  set_log_level(LogLevel::error);
  ::testing::internal::CaptureStderr();
  log_warn("suppressed");
  log(LogLevel::error, "shown");
  out = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(out, "[cpformer error] shown\n");

  set_log_level(LogLevel::debug);
  EXPECT_EQ(log_level(), LogLevel::debug);
  ::testing::internal::CaptureStderr();
  log_debug("dbg");
  out = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(out, "[cpformer debug] dbg\n");
}

// The level is read from CPF_LOG_LEVEL once, on first use; each case runs in a fresh process.
void expect_level_from_env(const char* value, LogLevel expected, const char* stderr_regex = "") {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        if (value) {
          setenv("CPF_LOG_LEVEL", value, 1);
        } else {
          unsetenv("CPF_LOG_LEVEL");
        }
        std::exit(log_level() == expected ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), stderr_regex)
      << "CPF_LOG_LEVEL=" << (value ? value : "(unset)");
}

TEST(LoggingEnv, LevelParsing) {
  expect_level_from_env(nullptr, LogLevel::info);
  expect_level_from_env("", LogLevel::info);
  expect_level_from_env("debug", LogLevel::debug);
  expect_level_from_env("info", LogLevel::info);
  expect_level_from_env("warn", LogLevel::warn);
  expect_level_from_env("error", LogLevel::error);
  expect_level_from_env("WARNING", LogLevel::warn);
  expect_level_from_env("Debug", LogLevel::debug);
  // Unknown values fall back to info and say so.
  expect_level_from_env("verbose", LogLevel::info, "CPF_LOG_LEVEL='verbose' is not one of debug, info, warn, error");
}

}  // namespace
}  // namespace cpf
