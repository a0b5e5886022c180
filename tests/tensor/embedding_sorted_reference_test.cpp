// The algorithm of the device embedding gradient (framework/tensor/cuda/embedding_backward.cu), run on
// the host: a stable sort of (id, position) pairs, each run of equal ids cut into segments of
// kEmbeddingSegment sorted indices, each segment summed from 0 in the compute type (rows in sorted =
// position order, kAhead rows loaded before they are added), the segments' sums of a run added in
// order. Its bits must be raw::embedding_backward's on the CPU for every dtype: that is what makes the
// GPU kernel's result bitwise the CPU's, whatever the run lengths.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/embedding.h"
#include "framework/tensor/ops/embedding_segment.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

constexpr int kAhead = 16;  // the kernel's look-ahead
constexpr int64_t kSegment = raw::kEmbeddingSegment;

// C: the compute type (f32 for bf16), S: grad's storage type.
template <class S, class C>
std::vector<C> sorted_runs(const std::vector<S>& grad, const std::vector<int64_t>& ids, int64_t rows, int64_t cols) {
  const int64_t n = static_cast<int64_t>(ids.size());
  std::vector<int64_t> key(ids.size());
  for (int64_t i = 0; i < n; ++i) key[i] = ids[i] >= 0 && ids[i] < rows ? ids[i] : rows;  // bad ids: skipped
  std::vector<int64_t> order(ids.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return key[a] < key[b]; });
  std::vector<C> out(static_cast<size_t>(rows * cols), C(0));
  for (int64_t start = 0; start < n; ++start) {
    const int64_t k0 = key[order[start]];
    if (k0 == rows || (start > 0 && key[order[start - 1]] == k0)) continue;  // not a run's first
    for (int64_t col = 0; col < cols; ++col) {
      C total = C(0);
      for (int64_t seg = start; seg < n && key[order[seg]] == k0; seg += kSegment) {
        const int64_t end = std::min(seg + kSegment, n);
        C s = C(0);
        for (int64_t k = seg; k < end && key[order[k]] == k0; k += kAhead) {
          C row[kAhead];
          int m = 0;
          for (int j = 0; j < kAhead && k + j < end && key[order[k + j]] == k0; ++j, ++m) {
            row[j] = static_cast<C>(grad[order[k + j] * cols + col]);
          }
          for (int j = 0; j < m; ++j) s += row[j];
        }
        total = seg == start ? s : total + s;  // the first segment's sum as it is
      }
      out[k0 * cols + col] = total;
    }
  }
  return out;
}

std::vector<int64_t> text_like_ids(int64_t n, int64_t rows) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = i % 4 == 0 ? (i / 4) % 3 : (i * 7919 + 13) % rows;
  return v;
}

TEST(EmbeddingSortedReference, MatchesTheCpuOpBitForBit) {
  const int64_t n = 3000, rows = 500, cols = 7;  // runs of ~250 for ids 0..2
  const std::vector<int64_t> ids = text_like_ids(n, rows);
  const Tensor id_tensor = from_vector(ids, {n});
  const Tensor g64 = testing::random_tensor({n, cols}, DType::f64, 31, -1e3, 1e3);
  {
    const std::vector<double> g = g64.to_vector<double>();
    EXPECT_EQ((sorted_runs<double, double>(g, ids, rows, cols)),
              raw::embedding_backward(g64, id_tensor, rows).to_vector<double>());
  }
  {
    const Tensor g32 = raw::to(g64, DType::f32);
    const std::vector<float> g = g32.to_vector<float>();
    EXPECT_EQ((sorted_runs<float, float>(g, ids, rows, cols)),
              raw::embedding_backward(g32, id_tensor, rows).to_vector<float>());
  }
  {
    // bf16: summed in f32 and rounded once; compare the f32 sums' rounding with the op's bf16 result.
    const Tensor gb = raw::to(g64, DType::bf16);
    const std::vector<float> g = raw::to(gb, DType::f32).to_vector<float>();
    const std::vector<float> sums = sorted_runs<float, float>(g, ids, rows, cols);
    const Tensor rounded = raw::to(from_vector(sums, {rows, cols}), DType::bf16);
    EXPECT_EQ(raw::to(rounded, DType::f32).to_vector<float>(),
              raw::to(raw::embedding_backward(gb, id_tensor, rows), DType::f32).to_vector<float>());
  }
}

TEST(EmbeddingSortedReference, TheOrderOfTermsMatters) {
  // Guards the test above: the same three f32 terms give 0 or 1 by their order (1e8 + 1 rounds to
  // 1e8), and both the reference and the op follow the ids' order.
  const Tensor ids = from_vector<int64_t>({0, 0, 0}, {3});
  for (const auto& [g, expected] : {std::pair{std::vector<float>{1e8f, 1.0f, -1e8f}, 0.0f},
                                    std::pair{std::vector<float>{1e8f, -1e8f, 1.0f}, 1.0f}}) {
    EXPECT_EQ((sorted_runs<float, float>(g, {0, 0, 0}, 1, 1)), std::vector<float>{expected});
    EXPECT_EQ(raw::embedding_backward(from_vector(g, {3, 1}), ids, 1).to_vector<float>(), std::vector<float>{expected});
  }
}

TEST(EmbeddingSortedReference, AFrequentIdIsSummedInSegments) {
  // 66 occurrences of id 0: a segment of kSegment rows (1e8, then zeros) and one of 2 rows (4, 4). In
  // f32, 1e8 + 4 rounds back to 1e8 (a tie to even), so the plain position order gives 1e8 while the
  // segmented order adds 1e8 + (4 + 4) = 100000008 exactly.
  static_assert(kSegment == 64, "the terms below assume 64-row segments");
  std::vector<float> g(66, 0.0f);
  g[0] = 1e8f;
  g[64] = g[65] = 4.0f;
  float plain = 0.0f;
  for (float v : g) plain += v;
  EXPECT_EQ(plain, 1e8f);
  const std::vector<int64_t> ids(66, 0);
  EXPECT_EQ((sorted_runs<float, float>(g, ids, 1, 1)), std::vector<float>{100000008.0f});
  EXPECT_EQ(raw::embedding_backward(from_vector(g, {66, 1}), from_vector(ids, {66}), 1).to_vector<float>(),
            std::vector<float>{100000008.0f});
  // At most kSegment occurrences: the plain order.
  const std::vector<float> short_run{1e8f, 4.0f, 4.0f};
  EXPECT_EQ(raw::embedding_backward(from_vector(short_run, {3, 1}), from_vector<int64_t>({0, 0, 0}, {3}), 1)
                .to_vector<float>(),
            std::vector<float>{1e8f});
}

TEST(EmbeddingSortedReference, LongRunPartialSlotsAreUniqueAndInBounds) {
  // The device kernel (embedding_backward.cu) writes the sum of each segment of a long run (more than
  // kSegment rows) to slot 2 * (k / kSegment) + (k is the run's first index), k its first sorted index,
  // in a buffer of 2 * ceil(n / kSegment) slots: a tile of kSegment sorted indices holds at most one
  // continuing segment of a run begun before it and one long run's start. Checked over many run-length
  // mixes, long and short runs meeting at every offset of a tile.
  uint64_t state = 12345;
  const auto next = [&state](int64_t bound) {  // a small LCG: deterministic run lengths
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<int64_t>((state >> 33) % static_cast<uint64_t>(bound));
  };
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<int64_t> lengths;
    int64_t n = 0;
    const int64_t runs = 1 + next(40);
    for (int64_t r = 0; r < runs; ++r) {
      const int64_t kind = next(4);
      const int64_t len = kind == 0 ? 1 + next(3) : kind == 1 ? kSegment - 1 + next(3) : 1 + next(5 * kSegment);
      lengths.push_back(len);
      n += len;
    }
    std::vector<int> used(static_cast<size_t>(2 * ((n + kSegment - 1) / kSegment)), 0);
    int64_t start = 0;
    for (int64_t len : lengths) {
      if (len > kSegment) {
        for (int64_t k = start; k < start + len; k += kSegment) {
          const int64_t slot = 2 * (k / kSegment) + (k == start ? 1 : 0);
          ASSERT_LT(slot, static_cast<int64_t>(used.size())) << "trial " << trial;
          ASSERT_EQ(used[static_cast<size_t>(slot)]++, 0) << "trial " << trial << ": slot " << slot << " twice";
        }
      }
      start += len;
    }
  }
}

}  // namespace
}  // namespace cpf
