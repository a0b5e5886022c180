// Every input the process group rejects, with its message: checks one rank can make alone (thrown
// at the call) and checks that need several ranks (thrown on every rank of the group).
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "distributed/dist_test_utils.h"
#include "framework/distributed/thread/thread_process_group.h"

namespace cpf::testing {
namespace {

using dist::P2POp;

TEST(ValidationTest, ReduceOpsMustSuitTheDtype) {
  run_ranks(2, [](RankContext& ctx) {
    auto& pg = *ctx.world;
    EXPECT_CPF_ERROR(pg.all_reduce(ones({3}, {.dtype = DType::i64}), ReduceOp::avg),
                     "all_reduce on group 'world': avg needs a floating dtype (f32, f64, bf16), got i64");
    EXPECT_CPF_ERROR(pg.all_reduce(ones({3}, {.dtype = DType::boolean})),
                     "sum of bool tensors is not meaningful; use max (logical or) or min (logical and)");
    EXPECT_CPF_ERROR(pg.reduce_scatter(ones({4}, {.dtype = DType::i32}), 0, ReduceOp::avg),
                     "reduce_scatter on group 'world': avg needs a floating dtype");
  });
}

TEST(ValidationTest, OutMustMatchAndNotOverlap) {
  run_ranks(2, [](RankContext& ctx) {
    auto& pg = *ctx.world;
    const Tensor x = ones({4, 6});
    EXPECT_CPF_ERROR(pg.all_reduce_async(x, ReduceOp::sum, zeros({4, 6}, {.dtype = DType::f64})),
                     "all_reduce on group 'world': out is f64 but the input is f32");
    EXPECT_CPF_ERROR(pg.all_reduce_async(x, ReduceOp::sum, zeros({6, 4})),
                     "out has shape [6,4] but the result has shape [4,6]");
    EXPECT_CPF_ERROR(pg.all_reduce_async(raw::narrow(x, 1, 0, 3), ReduceOp::sum, raw::narrow(x, 1, 3, 3)),
                     "out shares memory with the input without being the same view");
    EXPECT_CPF_ERROR(pg.broadcast_async(x, 0, raw::transpose(raw::view(x, {6, 4}), 0, 1)),
                     "broadcast on group 'world': out shares memory with the input without being the same view");
    Tensor big = zeros({2, 4, 6});
    EXPECT_CPF_ERROR(
        pg.all_gather_async(raw::select(big, 0, 0), 0, raw::view(big, {8, 6})),
        "all_gather on group 'world': out shares memory with the input; this operation cannot run in place");
    EXPECT_CPF_ERROR(pg.all_to_all_async(x, 0, 1, x),
                     "all_to_all on group 'world': out has shape [4,6] but the "
                     "result has shape [2,12]");
    EXPECT_CPF_ERROR(pg.reduce_scatter_async(x, 0, ReduceOp::sum, zeros({2, 5})),
                     "reduce_scatter on group 'world': out has shape [2,5] but the result has shape [2,6]");
    EXPECT_CPF_ERROR(pg.all_reduce(Tensor()), "all_reduce on group 'world': the input tensor is undefined");
  });
}

TEST(ValidationTest, DimsAndRootsMustBeInRange) {
  run_ranks(2, [](RankContext& ctx) {
    auto& pg = *ctx.world;
    const Tensor x = ones({4, 6});
    EXPECT_CPF_ERROR(pg.all_gather(x, 2), "all_gather on group 'world': dim 2 out of range for a tensor of rank 2");
    EXPECT_CPF_ERROR(pg.all_gather(scalar_tensor(1.0), 0), "cannot gather a 0-d tensor");
    EXPECT_CPF_ERROR(pg.reduce_scatter(x, -3), "reduce_scatter on group 'world': dim -3 out of range");
    EXPECT_CPF_ERROR(pg.reduce_scatter(scalar_tensor(1.0), 0), "cannot scatter a 0-d tensor");
    EXPECT_CPF_ERROR(pg.all_to_all(x, 0, 5), "all_to_all on group 'world': dim 5 out of range");
    EXPECT_CPF_ERROR(pg.all_to_all(scalar_tensor(1.0), 0, 0), "cannot split a 0-d tensor");
    EXPECT_CPF_ERROR(pg.broadcast(x, 2), "broadcast on group 'world': root 2 is out of range for a group of size 2");
    EXPECT_CPF_ERROR(pg.broadcast(x, -1), "root -1 is out of range");
  });
}

TEST(ValidationTest, AllToAllNeedsAnEvenSplit) {
  run_ranks(4, [](RankContext& ctx) {
    EXPECT_CPF_ERROR(ctx.world->all_to_all(ones({2, 6, 8}), 1, 2),
                     "all_to_all on group 'world': split dim 1 of size 6 cannot be split evenly across 4 ranks (input "
                     "[2,6,8])");
  });
}

TEST(ValidationTest, ReduceScatterSplitsMustCoverTheDim) {
  run_ranks(3, [](RankContext& ctx) {
    auto& pg = *ctx.world;
    const Tensor x = ones({7, 2});
    EXPECT_CPF_ERROR(pg.reduce_scatter(x, 0, ReduceOp::sum, {3, 4}),
                     "splits [3,4] has 2 entries for a group of size 3");
    EXPECT_CPF_ERROR(pg.reduce_scatter(x, 0, ReduceOp::sum, {3, 5, -1}), "splits [3,5,-1] has a negative size");
    EXPECT_CPF_ERROR(pg.reduce_scatter(x, 0, ReduceOp::sum, {3, 3, 3}),
                     "splits [3,3,3] add up to 9 but dim 0 of the input [7,2] has size 7");
    // Pieces given by each rank's out must add up too; only the ranks together can tell.
    EXPECT_CPF_ERROR(pg.reduce_scatter_async(x, 0, ReduceOp::sum, zeros({3, 2}))->wait(),
                     "the ranks' pieces along dim 0 are [3,3,3] and add up to 9, but the input [7,2] has 7");
  });
}

TEST(ValidationTest, ShapesDtypesAndParametersMustAgreeAcrossRanks) {
  run_ranks(3, [](RankContext& ctx) {
    auto& pg = *ctx.world;
    const int r = ctx.rank;
    EXPECT_CPF_ERROR(pg.all_reduce(ones({2, r == 2 ? 4 : 3})),
                     "all_reduce on group 'world': ranks disagree on the shape: rank 0 has [2,3], rank 2 has [2,4]");
    EXPECT_CPF_ERROR(pg.all_reduce(ones({3}, {.dtype = r == 1 ? DType::f64 : DType::f32})),
                     "ranks disagree on the dtype: rank 0 has f32, rank 1 has f64");
    EXPECT_CPF_ERROR(pg.all_reduce(ones({3}), r == 1 ? ReduceOp::max : ReduceOp::sum),
                     "ranks disagree on the reduce op: rank 0 has sum, rank 1 has max");
    EXPECT_CPF_ERROR(pg.broadcast(ones({3}), r == 2 ? 1 : 0), "broadcast on group 'world': ranks disagree on the root");
    EXPECT_CPF_ERROR(pg.all_gather(ones({2, 3 + r}), r == 1 ? 1 : 0),
                     "ranks disagree on the dim: rank 0 has 0, rank 1 has 1");
    EXPECT_CPF_ERROR(pg.all_gather(ones({2 + r, r == 1 ? 4 : 3}), 0),
                     "all_gather on group 'world': ranks disagree on the shape outside dim 0: rank 0 has [2,3], rank 1 "
                     "has [3,4]");
    Tensor out = r == 0 ? zeros({5, 3}) : zeros({6, 3});
    EXPECT_CPF_ERROR(
        pg.all_gather_async(ones({2, 3}), 0, out)->wait(),
        "rank 0's out has shape [5,3] but the gathered result has shape [6,3] (sizes along dim 0: [2,2,2])");
    EXPECT_CPF_ERROR(
        pg.reduce_scatter(ones({6}), 0, ReduceOp::sum, r == 0 ? std::vector<int64_t>{} : std::vector<int64_t>{1, 2, 3}),
        "ranks disagree on the splits: rank 0 has [], rank 1 has [1,2,3]");
    EXPECT_CPF_ERROR(pg.all_to_all(ones({3, 3}), r == 2 ? 1 : 0, 1), "ranks disagree on the split dim");
    EXPECT_CPF_ERROR(pg.all_to_all(ones({3, 3}), 0, r == 2 ? 0 : 1), "ranks disagree on the concat dim");
    // A collective that failed on every rank leaves the group usable.
    EXPECT_TRUE(same_tensor(pg.all_reduce(ones({2})), full({2}, 3.0)));
  });
}

TEST(ValidationTest, RanksMustIssueTheSameOperations) {
  run_ranks(2, [](RankContext& ctx) {
    auto& pg = *ctx.world;
    if (ctx.rank == 0) {
      EXPECT_CPF_ERROR(pg.all_reduce(ones({2})),
                       "all_reduce on group 'world': ranks issued different operations at "
                       "step 0: rank 0 called all_reduce, rank 1 called barrier");
    } else {
      EXPECT_CPF_ERROR(pg.barrier(), "barrier on group 'world': ranks issued different operations at step 0");
    }
  });
}

TEST(ValidationTest, PointToPointChecksPeersTagsAndShapes) {
  run_ranks(2, [](RankContext& ctx) {
    auto& pg = *ctx.world;
    EXPECT_CPF_ERROR(pg.send(ones({2}), 2),
                     "batch_p2p on group 'world': destination 2 is out of range for a group of size 2");
    EXPECT_CPF_ERROR(pg.recv(zeros({2}), -1), "source -1 is out of range");
    EXPECT_CPF_ERROR(pg.send(ones({2}), 1 - ctx.rank, -4), "op 0 (send) has a negative tag -4");
    EXPECT_CPF_ERROR(pg.batch_p2p({P2POp::send(ones({2}), 0), P2POp::recv(Tensor(), 0)}),
                     "op 1 (recv) has an undefined tensor");
    if (ctx.rank == 0) {
      // The batch's receive keeps rank 0's send pending until rank 1 has rejected it, so the
      // sender learns of the rejection too.
      Tensor ack = zeros({1});
      EXPECT_CPF_ERROR(pg.batch_p2p({P2POp::send(ones({2, 3}), 1), P2POp::recv(ack, 1, 9)}),
                       "send to rank 1 (tag 0) on group 'world': rank 1 rejected the message: rank 0 sent [2,3] f32 "
                       "with tag 0 but rank 1 receives into [3,2] f32");
    } else {
      EXPECT_CPF_ERROR(
          pg.recv(zeros({3, 2}), 0),
          "recv from rank 0 (tag 0) on group 'world': rank 0 sent [2,3] f32 with tag 0 but rank 1 receives "
          "into [3,2] f32");
      pg.send(ones({1}), 0, 9);
    }
  });
}

TEST(ValidationTest, NewGroupRanksMustBeValidAndAgree) {
  run_ranks(4, [](RankContext& ctx) {
    auto& pg = *ctx.world;
    EXPECT_CPF_ERROR(pg.new_group({}), "new_group on group 'world': the rank list is empty");
    EXPECT_CPF_ERROR(pg.new_group({0, 4}), "new_group on group 'world': rank 4 is out of range for a group of size 4");
    EXPECT_CPF_ERROR(pg.new_group({1, -1}), "rank -1 is out of range");
    EXPECT_CPF_ERROR(pg.new_group({0, 2, 2}), "new_group on group 'world': rank 2 appears twice in [0,2,2]");
    EXPECT_CPF_ERROR(pg.new_group({0, ctx.rank == 3 ? 2 : 1}),
                     "ranks disagree on the member ranks: rank 0 has [0,1], rank 3 has [0,2]");
    EXPECT_CPF_ERROR(pg.new_group({0, 1}, ctx.rank == 1 ? "b" : "a"),
                     "ranks disagree on the name: rank 0 has a, rank 1 has b");
  });
}

TEST(ValidationTest, EvenSplitsNeedParts) {
  EXPECT_EQ(dist::even_splits(7, 3), (std::vector<int64_t>{3, 2, 2}));
  EXPECT_CPF_ERROR(dist::even_splits(7, 0), "even_splits: need at least one part, got 0");
}

TEST(ValidationTest, WorldAndWorkMisuse) {
  EXPECT_CPF_ERROR(dist::thread::ThreadWorld::create(0), "ThreadWorld: the world needs at least one rank, got 0");
  EXPECT_CPF_ERROR(dist::thread::ThreadWorld::create(2, {.timeout = 0ms}), "ThreadWorld: the timeout must be positive");
  auto world = dist::thread::ThreadWorld::create(2);
  auto pg0 = world->group(0);
  EXPECT_CPF_ERROR(world->group(0), "ThreadWorld::group: rank 0's handle was already created");
  EXPECT_CPF_ERROR(world->group(2), "ThreadWorld::group: rank 2 is out of range for a world of size 2");
  EXPECT_CPF_ERROR(dist::launch(0, [](RankContext&) {}), "launch: need at least one rank, got 0");
  EXPECT_CPF_ERROR(dist::launch(2, [](RankContext&) {}, {.omp_threads_per_rank = -1}),
                   "launch: omp_threads_per_rank must be >= 0, got -1");

  std::atomic<bool> checked{false};
  run_ranks(2, [&](RankContext& ctx) {
    auto& pg = *ctx.world;
    if (ctx.rank == 1) {
      Tensor out = zeros({2});
      dist::WorkPtr w = pg.recv_async(out, 0);
      EXPECT_FALSE(w->is_completed());
      EXPECT_CPF_ERROR(w->result(), "batch_p2p on group 'world': result() before the operation completed");
      checked = true;
      w->wait();
      EXPECT_TRUE(w->is_completed());
      EXPECT_TRUE(same_tensor(out, ones({2})));
    } else {
      while (!checked) std::this_thread::yield();
      pg.send(ones({2}), 1);
    }
    EXPECT_CPF_ERROR(pg.barrier_async()->wait_tensor(),
                     "barrier on group 'world': wait_tensor() needs exactly one result");
  });
}

}  // namespace
}  // namespace cpf::testing
