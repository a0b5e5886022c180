#pragma once
#include "framework/autograd/gradcheck.h"
#include "support/test_utils.h"

// Asserts that gradcheck passes and prints its report otherwise.
#define EXPECT_GRADCHECK(fn, inputs, ...)                                                   \
  do {                                                                                      \
    const ::cpf::GradcheckReport cpf_report_ = ::cpf::gradcheck(fn, inputs, ##__VA_ARGS__); \
    EXPECT_TRUE(cpf_report_.ok) << cpf_report_.str();                                       \
    EXPECT_GT(cpf_report_.checked, 0);                                                      \
  } while (0)
