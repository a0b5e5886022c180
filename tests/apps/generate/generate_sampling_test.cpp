// Next-token sampling (apps/generate/generate_sampling.h): greedy, temperature, top-k, top-p and their
// combination give the documented distributions; draws follow them; bad options are refused by name.
#include "apps/generate/generate_sampling.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "framework/core/error.h"

namespace cpf::trainer {
namespace {

using ::testing::DoubleNear;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Logits whose softmax (temperature 1) is exactly `p`.
std::vector<double> logits_of(const std::vector<double>& p) {
  std::vector<double> l;
  for (double v : p) l.push_back(std::log(v));
  return l;
}

TEST(Sampling, GreedyIsOneHotAtTheFirstMaximum) {
  const std::vector<double> logits{0.5, 2.0, -1.0, 2.0};
  EXPECT_THAT(sampling_distribution(logits, {}), ElementsAre(0, 1, 0, 0));
  Generator gen(1);
  EXPECT_EQ(sample_token(logits, {}, gen), 1);
}

TEST(Sampling, TemperatureScalesTheSoftmax) {
  const std::vector<double> logits{0.0, std::log(3.0)};  // p = [1/4, 3/4] at temperature 1
  EXPECT_THAT(sampling_distribution(logits, {.temperature = 1.0}),
              ElementsAre(DoubleNear(0.25, 1e-12), DoubleNear(0.75, 1e-12)));
  // Temperature 0.5 squares the odds: 1 : 9.
  EXPECT_THAT(sampling_distribution(logits, {.temperature = 0.5}),
              ElementsAre(DoubleNear(0.1, 1e-12), DoubleNear(0.9, 1e-12)));
}

TEST(Sampling, TopKKeepsTheKMostLikelyWithTiesToTheLowerId) {
  const std::vector<double> logits = logits_of({0.1, 0.4, 0.1, 0.4});
  EXPECT_THAT(sampling_distribution(logits, {.temperature = 1.0, .top_k = 1}), ElementsAre(0, 1, 0, 0));
  EXPECT_THAT(sampling_distribution(logits, {.temperature = 1.0, .top_k = 3}),
              ElementsAre(DoubleNear(1.0 / 9, 1e-12), DoubleNear(4.0 / 9, 1e-12), 0, DoubleNear(4.0 / 9, 1e-12)));
  // k at or beyond the vocabulary keeps every token.
  EXPECT_THAT(
      sampling_distribution(logits, {.temperature = 1.0, .top_k = 50}),
      ElementsAre(DoubleNear(0.1, 1e-12), DoubleNear(0.4, 1e-12), DoubleNear(0.1, 1e-12), DoubleNear(0.4, 1e-12)));
}

TEST(Sampling, TopPKeepsTheSmallestSetReachingP) {
  const std::vector<double> logits = logits_of({0.15, 0.5, 0.05, 0.3});
  // 0.5 + 0.3 = 0.8 >= 0.7: two tokens, renormalised.
  EXPECT_THAT(sampling_distribution(logits, {.temperature = 1.0, .top_p = 0.7}),
              ElementsAre(0, DoubleNear(0.625, 1e-12), 0, DoubleNear(0.375, 1e-12)));
  // The most likely token alone reaches 0.5.
  EXPECT_THAT(sampling_distribution(logits, {.temperature = 1.0, .top_p = 0.5}), ElementsAre(0, 1, 0, 0));
  // A tiny p still keeps one token.
  EXPECT_THAT(sampling_distribution(logits, {.temperature = 1.0, .top_p = 1e-9}), ElementsAre(0, 1, 0, 0));
  // 0.5 + 0.3 + 0.15 = 0.95 >= 0.9: three tokens.
  EXPECT_THAT(
      sampling_distribution(logits, {.temperature = 1.0, .top_p = 0.9}),
      ElementsAre(DoubleNear(0.15 / 0.95, 1e-12), DoubleNear(0.5 / 0.95, 1e-12), 0, DoubleNear(0.3 / 0.95, 1e-12)));
}

TEST(Sampling, TopPActsOnTheTopKRenormalised) {
  const std::vector<double> logits = logits_of({0.15, 0.5, 0.05, 0.3});
  // Top-2 leaves [0.625, 0.375]; p = 0.6 is reached by the first alone.
  EXPECT_THAT(sampling_distribution(logits, {.temperature = 1.0, .top_k = 2, .top_p = 0.6}), ElementsAre(0, 1, 0, 0));
  EXPECT_THAT(sampling_distribution(logits, {.temperature = 1.0, .top_k = 2, .top_p = 0.7}),
              ElementsAre(0, DoubleNear(0.625, 1e-12), 0, DoubleNear(0.375, 1e-12)));
}

TEST(Sampling, DrawsFollowTheFilteredDistribution) {
  const std::vector<double> logits = logits_of({0.15, 0.5, 0.05, 0.3});
  const SamplingOptions o{.temperature = 1.0, .top_k = 3, .top_p = 0.9};
  const std::vector<double> p = sampling_distribution(logits, o);
  Generator gen(42);
  std::vector<int> counts(4, 0);
  const int draws = 20000;
  for (int i = 0; i < draws; ++i) ++counts[static_cast<size_t>(sample_token(logits, o, gen))];
  EXPECT_EQ(counts[2], 0);  // filtered out: never drawn
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(counts[i] / static_cast<double>(draws), p[i], 0.015) << i;
  // Seeded: the same stream gives the same tokens.
  Generator a(7), b(7);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(sample_token(logits, o, a), sample_token(logits, o, b));
}

std::string error_of(const SamplingOptions& o) {
  try {
    check_sampling_options(o);
  } catch (const Error& e) {
    return e.message();
  }
  return "(accepted)";
}

TEST(Sampling, BadOptionsAreRefusedByName) {
  EXPECT_EQ(error_of({.temperature = 0.8, .top_k = 40, .top_p = 0.95}), "(accepted)");
  EXPECT_EQ(error_of({}), "(accepted)");
  EXPECT_THAT(error_of({.temperature = -1}), HasSubstr("generate: --temperature -1 must be >= 0 (0 = greedy)"));
  EXPECT_THAT(error_of({.temperature = std::numeric_limits<double>::infinity()}),
              HasSubstr("generate: --temperature inf must be >= 0"));
  EXPECT_THAT(error_of({.temperature = 1, .top_k = -3}), HasSubstr("generate: --top-k -3 must be >= 0"));
  EXPECT_THAT(error_of({.temperature = 1, .top_p = 0}), HasSubstr("generate: --top-p 0 must be in (0, 1]"));
  EXPECT_THAT(error_of({.temperature = 1, .top_p = 1.5}), HasSubstr("generate: --top-p 1.5 must be in (0, 1]"));
  EXPECT_THAT(error_of({.top_k = 5}), HasSubstr("but --temperature 0 is greedy decoding"));
  EXPECT_THAT(error_of({.top_p = 0.9}), HasSubstr("set --temperature > 0 (e.g. 0.8) to sample"));
}

}  // namespace
}  // namespace cpf::trainer
