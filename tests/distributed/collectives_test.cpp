// Every collective of the thread backend against a serial computation: group sizes 1, 2, 3, 4 and
// 8, dtypes f32/f64/bf16/i64, contiguous and strided inputs. Results must match bit for bit.
#include <gtest/gtest.h>

#include <tuple>

#include "distributed/dist_test_utils.h"

namespace cpf::testing {
namespace {

using Param = std::tuple<int, DType, Layout>;

class CollectiveTest : public ::testing::TestWithParam<Param> {
 protected:
  int n() const { return std::get<0>(GetParam()); }
  DType dtype() const { return std::get<1>(GetParam()); }
  Layout layout() const { return std::get<2>(GetParam()); }
  Tensor input(const Shape& shape, int rank, uint64_t salt = 0) const {
    return make_input(shape, dtype(), 1000 * salt + 17 * static_cast<uint64_t>(rank) + 1, layout());
  }
  std::vector<ReduceOp> ops() const {
    if (is_floating(dtype())) return {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min};
    return {ReduceOp::sum, ReduceOp::max, ReduceOp::min};
  }
};

TEST_P(CollectiveTest, AllReduceMatchesSerialReduction) {
  const Shape shape{5, 7};  // 35 elements: the per-rank ranges are uneven for n = 2, 3, 4, 8
  const auto xs = all_inputs(n(), [&](int r) { return input(shape, r); });
  run_ranks(n(), [&](RankContext& ctx) {
    const Tensor x = input(shape, ctx.rank);
    for (ReduceOp op : ops()) {
      EXPECT_TRUE(same_tensor(ctx.world->all_reduce(x, op), reference_reduce(xs, op))) << dist::reduce_op_name(op);
      Tensor in_place = input(shape, ctx.rank);
      ctx.world->all_reduce_(in_place, op);
      EXPECT_TRUE(same_tensor(in_place, reference_reduce(xs, op))) << "in place " << dist::reduce_op_name(op);
    }
    EXPECT_TRUE(same_tensor(x, xs[static_cast<size_t>(ctx.rank)])) << "the input was modified";
  });
}

TEST_P(CollectiveTest, BroadcastCopiesRootToEveryRank) {
  const Shape shape{4, 3, 2};
  for (int root : {0, n() - 1}) {
    const Tensor expected = input(shape, root);
    run_ranks(n(), [&](RankContext& ctx) {
      EXPECT_TRUE(same_tensor(ctx.world->broadcast(input(shape, ctx.rank), root), expected));
      Tensor in_place = input(shape, ctx.rank);
      ctx.world->broadcast_(in_place, root);
      EXPECT_TRUE(same_tensor(in_place, expected));
    });
  }
}

TEST_P(CollectiveTest, AllGatherConcatenatesUnevenPiecesInRankOrder) {
  // Rank r contributes 1 + r % 3 rows along dim 1, so the pieces differ in size.
  const auto shape_of = [](int r) { return Shape{3, 1 + r % 3, 4}; };
  const auto xs = all_inputs(n(), [&](int r) { return input(shape_of(r), r); });
  const Tensor expected = raw::cat(xs, 1);
  const auto even = all_inputs(n(), [&](int r) { return input({2, 3}, r, 1); });
  run_ranks(n(), [&](RankContext& ctx) {
    EXPECT_TRUE(same_tensor(ctx.world->all_gather(input(shape_of(ctx.rank), ctx.rank), 1), expected));
    EXPECT_TRUE(same_tensor(ctx.world->all_gather(input(shape_of(ctx.rank), ctx.rank), -2), expected));
    EXPECT_TRUE(same_tensor(ctx.world->all_gather(input({2, 3}, ctx.rank, 1), 0), raw::cat(even, 0)));
  });
}

TEST_P(CollectiveTest, ReduceScatterKeepsThisRanksPiece) {
  const Shape shape{3, 2 * n() + 1, 2};  // not divisible by n (except n = 1): pieces of n/n+1 rows
  const auto xs = all_inputs(n(), [&](int r) { return input(shape, r); });
  const auto splits = dist::even_splits(shape[1], n());
  // Rank 0 gets nothing (when n > 1), rank 1 one row (when n > 2), the last rank the rest.
  std::vector<int64_t> skewed(static_cast<size_t>(n()), 0);
  if (n() > 2) skewed[1] = 1;
  skewed.back() = shape[1] - (n() > 2 ? 1 : 0);
  run_ranks(n(), [&](RankContext& ctx) {
    const Tensor x = input(shape, ctx.rank);
    int64_t offset = 0, skewed_offset = 0;
    for (int r = 0; r < ctx.rank; ++r) {
      offset += splits[static_cast<size_t>(r)];
      skewed_offset += skewed[static_cast<size_t>(r)];
    }
    for (ReduceOp op : ops()) {
      const Tensor full = reference_reduce(xs, op);
      const Tensor mine = raw::narrow(full, 1, offset, splits[static_cast<size_t>(ctx.rank)]);
      EXPECT_TRUE(same_tensor(ctx.world->reduce_scatter(x, 1, op), mine)) << dist::reduce_op_name(op);
      const Tensor skewed_mine = raw::narrow(full, 1, skewed_offset, skewed[static_cast<size_t>(ctx.rank)]);
      EXPECT_TRUE(same_tensor(ctx.world->reduce_scatter(x, 1, op, skewed), skewed_mine)) << "skewed";
    }
  });
}

TEST_P(CollectiveTest, AllToAllScattersHeadsAndGathersSequence) {
  // Ulysses: (B, S/P, H, D) -> (B, S, H/P, D): split the head dim, concatenate the sequence dim.
  const Shape shape{2, 3, 2 * n(), 5};
  const auto xs = all_inputs(n(), [&](int r) { return input(shape, r); });
  run_ranks(n(), [&](RankContext& ctx) {
    const Tensor x = input(shape, ctx.rank);
    std::vector<Tensor> pieces;
    for (const Tensor& xs_s : xs) pieces.push_back(raw::narrow(xs_s, 2, 2 * ctx.rank, 2));
    const Tensor y = ctx.world->all_to_all(x, 2, 1);
    EXPECT_TRUE(same_tensor(y, raw::cat(pieces, 1)));
    // The inverse call restores the input.
    EXPECT_TRUE(same_tensor(ctx.world->all_to_all(y, 1, 2), x));
    // Split and concatenate along the same dim: piece j of every rank's input goes to rank j.
    std::vector<Tensor> same_dim;
    for (const Tensor& xs_s : xs) same_dim.push_back(raw::narrow(xs_s, 2, 2 * ctx.rank, 2));
    EXPECT_TRUE(same_tensor(ctx.world->all_to_all(x, 2, 2), raw::cat(same_dim, 2)));
  });
}

TEST_P(CollectiveTest, RingShiftThroughBatchedAndBlockingPointToPoint) {
  const Shape shape{3, 4};
  const auto xs = all_inputs(n(), [&](int r) { return input(shape, r); });
  run_ranks(n(), [&](RankContext& ctx) {
    const int next = (ctx.rank + 1) % n(), prev = (ctx.rank + n() - 1) % n();
    const Tensor x = input(shape, ctx.rank);
    // Every rank sends to r+1 and receives from r-1 at once.
    Tensor got = empty(shape, {.dtype = dtype()});
    const auto received = ctx.world->batch_p2p({dist::P2POp::send(x, next), dist::P2POp::recv(got, prev)});
    ASSERT_EQ(received.size(), 1u);
    EXPECT_TRUE(received[0].is_same(got));
    EXPECT_TRUE(same_tensor(got, xs[static_cast<size_t>(prev)]));
    // Blocking sends first on every rank: a send never waits for its receiver.
    Tensor strided_out = raw::transpose(empty({shape[1], shape[0]}, {.dtype = dtype()}), 0, 1);
    ctx.world->send(x, next, 7);
    ctx.world->recv(strided_out, prev, 7);
    EXPECT_TRUE(same_tensor(strided_out, xs[static_cast<size_t>(prev)]));
  });
}

std::vector<Param> all_params() {
  std::vector<Param> out;
  for (int n : {1, 2, 3, 4, 8}) {
    for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::i64}) {
      for (Layout layout : {Layout::contiguous, Layout::strided}) out.emplace_back(n, dtype, layout);
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Sizes, CollectiveTest, ::testing::ValuesIn(all_params()),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return param_name(std::get<0>(info.param), std::get<1>(info.param), std::get<2>(info.param));
                         });

}  // namespace
}  // namespace cpf::testing
