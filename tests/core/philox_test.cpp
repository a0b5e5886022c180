// Philox4x32-10 against the Random123 known-answer vectors, and the statistics of the uniform and
// normal variates derived from it. Tensor-level draws (rand/randn through a Generator) are tested in
// tests/tensor/tensor_test.cpp.
#include "framework/core/philox.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <thread>
#include <vector>

#include "framework/core/generator.h"

namespace cpf {
namespace {

// Random123's kat_vectors for philox4x32_10: counter, key -> output.
struct KnownAnswer {
  PhiloxBlock counter;
  uint32_t key0, key1;
  PhiloxBlock expected;
};

TEST(Philox, KnownAnswerVectors) {
  const KnownAnswer vectors[] = {
      {{0, 0, 0, 0}, 0, 0, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
      {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
       0xffffffffu,
       0xffffffffu,
       {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
      {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
       0xa4093822u,
       0x299f31d0u,
       {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
  };
  for (const KnownAnswer& v : vectors) {
    const PhiloxBlock out = philox4x32_10(v.counter, v.key0, v.key1);
    for (int w = 0; w < 4; ++w) {
      EXPECT_EQ(out[w], v.expected[w]) << "word " << w << " for counter " << std::hex << v.counter[0];
    }
  }
}

TEST(Philox, BlockAddressingIsCounterLowHighAndSeedAsKey) {
  const uint64_t seed = 0x299f31d0a4093822ull;
  const uint64_t index = 0x85a308d3243f6a88ull;
  const PhiloxBlock direct = philox4x32_10({0x243f6a88u, 0x85a308d3u, 0, 0}, 0xa4093822u, 0x299f31d0u);
  EXPECT_EQ(philox_block(seed, index), direct);
  // Neighbouring indices and seeds give different blocks.
  EXPECT_NE(philox_block(seed, index), philox_block(seed, index + 1));
  EXPECT_NE(philox_block(seed, index), philox_block(seed + 1, index));
  EXPECT_NE(philox_block(seed, 0), philox_block(seed, uint64_t{1} << 32));  // the high word counts
}

TEST(Philox, UniformFloatAndDoubleStayInHalfOpenUnitInterval) {
  // Extremes of the bit patterns.
  EXPECT_EQ(uniform_float({0, 0, 0, 0}), 0.0f);
  EXPECT_LT(uniform_float({0xffffffffu, 0xffffffffu, 0, 0}), 1.0f);
  EXPECT_EQ(uniform_double({0, 0, 0, 0}), 0.0);
  EXPECT_LT(uniform_double({0xffffffffu, 0xffffffffu, 0, 0}), 1.0);
  EXPECT_TRUE(std::isfinite(normal_double({0, 0, 0, 0})));  // u1 is never 0, so log stays finite
  EXPECT_TRUE(std::isfinite(normal_double({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu})));
}

TEST(Philox, UniformStatistics) {
  constexpr int n = 200000;
  double sum = 0, sum_sq = 0;
  double min = 1, max = 0;
  int buckets[10] = {};
  for (int i = 0; i < n; ++i) {
    const PhiloxBlock b = philox_block(42, static_cast<uint64_t>(i));
    const double u = uniform_double(b);
    const float f = uniform_float(b);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    ASSERT_GE(f, 0.0f);
    ASSERT_LT(f, 1.0f);
    sum += u;
    sum_sq += u * u;
    min = std::min(min, u);
    max = std::max(max, u);
    buckets[static_cast<int>(u * 10)] += 1;
  }
  const double mean = sum / n;
  const double var = sum_sq / n - mean * mean;
  // Standard error of the mean is sqrt(1/12/n) = 6.5e-4; 5 sigma.
  EXPECT_NEAR(mean, 0.5, 3.3e-3);
  EXPECT_NEAR(var, 1.0 / 12.0, 2e-3);
  EXPECT_LT(min, 1e-4);
  EXPECT_GT(max, 1 - 1e-4);
  // Each decile holds 10% +- 5 sigma (sigma = sqrt(n * 0.1 * 0.9) = 134).
  for (int k = 0; k < 10; ++k) EXPECT_NEAR(buckets[k], n / 10, 700) << "decile " << k;
}

TEST(Philox, NormalStatistics) {
  constexpr int n = 200000;
  double sum = 0, sum_sq = 0, sum_4 = 0;
  int within_one = 0;
  for (int i = 0; i < n; ++i) {
    const double z = normal_double(philox_block(7, static_cast<uint64_t>(i)));
    ASSERT_TRUE(std::isfinite(z));
    sum += z;
    sum_sq += z * z;
    sum_4 += z * z * z * z;
    within_one += std::abs(z) < 1.0;
  }
  const double mean = sum / n;
  const double var = sum_sq / n - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.012);     // sigma 2.2e-3
  EXPECT_NEAR(var, 1.0, 0.016);      // sigma sqrt(2/n) = 3.2e-3
  EXPECT_NEAR(sum_4 / n, 3.0, 0.1);  // kurtosis of a normal
  EXPECT_NEAR(static_cast<double>(within_one) / n, 0.682689, 0.006);
}

TEST(Philox, AdjacentElementsAreUncorrelated) {
  constexpr int n = 100000;
  double sum_xy = 0, sum_x = 0, sum_x2 = 0;
  double prev = uniform_double(philox_block(3, 0));
  for (int i = 1; i <= n; ++i) {
    const double cur = uniform_double(philox_block(3, static_cast<uint64_t>(i)));
    sum_xy += prev * cur;
    sum_x += prev;
    sum_x2 += prev * prev;
    prev = cur;
  }
  const double mean = sum_x / n;
  const double cov = sum_xy / n - mean * mean;
  const double var = sum_x2 / n - mean * mean;
  EXPECT_NEAR(cov / var, 0.0, 0.02);  // sigma 1/sqrt(n) = 3.2e-3
}

TEST(Generator, StateIsSeedAndOffset) {
  Generator g(11);
  EXPECT_EQ(g.seed(), 11u);
  EXPECT_EQ(g.offset(), 0u);
  EXPECT_EQ(g.reserve(5), 0u);
  EXPECT_EQ(g.reserve(3), 5u);
  EXPECT_EQ(g.offset(), 8u);
  g.set_state(99, 1000);
  EXPECT_EQ(g.seed(), 99u);
  EXPECT_EQ(g.reserve(1), 1000u);
  EXPECT_EQ(g.offset(), 1001u);
}

TEST(Generator, ManualSeedResetsTheDefaultGenerator) {
  manual_seed(123);
  EXPECT_EQ(default_generator().seed(), 123u);
  EXPECT_EQ(default_generator().offset(), 0u);
  default_generator().reserve(10);
  manual_seed(123);
  EXPECT_EQ(default_generator().offset(), 0u);
}

TEST(Generator, ConcurrentReservationsNeverOverlap) {
  Generator g(5);
  constexpr int threads = 4, per_thread = 2000;
  std::vector<std::vector<uint64_t>> starts(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int i = 0; i < per_thread; ++i) starts[t].push_back(g.reserve(3));
    });
  }
  for (auto& th : pool) th.join();
  std::set<uint64_t> all;
  for (const auto& s : starts) all.insert(s.begin(), s.end());
  EXPECT_EQ(all.size(), static_cast<size_t>(threads * per_thread));
  EXPECT_EQ(g.offset(), static_cast<uint64_t>(threads * per_thread * 3));
  for (uint64_t s : all) EXPECT_EQ(s % 3, 0u);
}

}  // namespace
}  // namespace cpf
