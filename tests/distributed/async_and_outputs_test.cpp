// Asynchronous handles, caller-provided outputs, bool/i32 tensors, empty and 0-d tensors, NaN,
// concurrent groups and message ordering of the thread backend.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <thread>

#include "distributed/dist_test_utils.h"

namespace cpf::testing {
namespace {

using dist::P2POp;
using dist::WorkPtr;

Tensor rank_tensor(const Shape& shape, int rank, DType dtype = DType::f32) {
  return make_input(shape, dtype, 500 + static_cast<uint64_t>(rank));
}

TEST(AsyncTest, OperationsProgressWithoutWaitAndCompleteInAnyWaitOrder) {
  const int n = 4;
  const auto xs = all_inputs(n, [](int r) { return rank_tensor({4, 8}, r); });
  run_ranks(n, [&](RankContext& ctx) {
    auto& pg = *ctx.world;
    const Tensor x = xs[static_cast<size_t>(ctx.rank)];
    std::vector<WorkPtr> works{pg.all_reduce_async(x),       pg.all_gather_async(x, 1), pg.reduce_scatter_async(x, 1),
                               pg.all_to_all_async(x, 1, 0), pg.broadcast_async(x, 2),  pg.barrier_async()};
    // The rank's progress thread moves the data while this thread does something else.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!works.back()->is_completed() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(1ms);
    }
    EXPECT_TRUE(works.back()->is_completed());
    for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();
    EXPECT_TRUE(same_tensor(works[0]->result()[0], reference_reduce(xs, ReduceOp::sum)));
    EXPECT_TRUE(same_tensor(works[1]->result()[0], raw::cat(xs, 1)));
    EXPECT_TRUE(
        same_tensor(works[2]->result()[0], raw::narrow(reference_reduce(xs, ReduceOp::sum), 1, 2 * ctx.rank, 2)));
    std::vector<Tensor> pieces;
    for (const Tensor& s : xs) pieces.push_back(raw::narrow(s, 1, 2 * ctx.rank, 2));
    EXPECT_TRUE(same_tensor(works[3]->result()[0], raw::cat(pieces, 0)));
    EXPECT_TRUE(same_tensor(works[4]->result()[0], xs[2]));
    EXPECT_TRUE(works[5]->result().empty());
    EXPECT_EQ(works[0]->description(), "all_reduce on group 'world'");
  });
}

TEST(AsyncTest, ResultsLandInStridedOutTensors) {
  const int n = 3;
  const auto xs = all_inputs(n, [](int r) { return rank_tensor({6, 3}, r); });
  run_ranks(n, [&](RankContext& ctx) {
    auto& pg = *ctx.world;
    const Tensor x = xs[static_cast<size_t>(ctx.rank)];
    const auto strided = [](const Shape& shape) {
      return raw::transpose(zeros({shape[1], shape[0]}), 0, 1);  // shape, transposed strides
    };
    Tensor reduced = strided({6, 3}), gathered = strided({18, 3}), scattered = strided({2, 3}),
           exchanged = strided({2, 9}), copied = strided({6, 3});
    pg.all_reduce_async(x, ReduceOp::max, reduced)->wait();
    pg.all_gather_async(x, 0, gathered)->wait();
    pg.reduce_scatter_async(x, 0, ReduceOp::sum, scattered)->wait();
    pg.all_to_all_async(x, 0, 1, exchanged)->wait();
    pg.broadcast_async(x, 1, copied)->wait();
    EXPECT_TRUE(same_tensor(reduced, reference_reduce(xs, ReduceOp::max)));
    EXPECT_TRUE(same_tensor(gathered, raw::cat(xs, 0)));
    EXPECT_TRUE(same_tensor(scattered, raw::narrow(reference_reduce(xs, ReduceOp::sum), 0, 2 * ctx.rank, 2)));
    std::vector<Tensor> pieces;
    for (const Tensor& s : xs) pieces.push_back(raw::narrow(s, 0, 2 * ctx.rank, 2));
    EXPECT_TRUE(same_tensor(exchanged, raw::cat(pieces, 1)));
    EXPECT_TRUE(same_tensor(copied, xs[1]));
    // Writing through out counts as an in-place change of it.
    EXPECT_GT(reduced.version(), 0u);
  });
}

TEST(AsyncTest, BoolAndI32Tensors) {
  const int n = 3;
  const auto flags =
      all_inputs(n, [](int r) { return make_input({9}, DType::boolean, 40 + static_cast<uint64_t>(r)); });
  const auto ints = all_inputs(n, [](int r) { return make_input({2, 6}, DType::i32, 50 + static_cast<uint64_t>(r)); });
  run_ranks(n, [&](RankContext& ctx) {
    auto& pg = *ctx.world;
    const Tensor f = flags[static_cast<size_t>(ctx.rank)];
    const Tensor any = pg.all_reduce(f, ReduceOp::max), all = pg.all_reduce(f, ReduceOp::min);
    const auto a = flags[0].to_vector<bool>(), b = flags[1].to_vector<bool>(), c = flags[2].to_vector<bool>();
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(any.to_vector<bool>()[i], a[i] || b[i] || c[i]);
      EXPECT_EQ(all.to_vector<bool>()[i], a[i] && b[i] && c[i]);
    }
    EXPECT_TRUE(same_tensor(pg.all_gather(f, 0), raw::cat(flags, 0)));
    EXPECT_TRUE(same_tensor(pg.broadcast(f, 0), flags[0]));
    const Tensor i = ints[static_cast<size_t>(ctx.rank)];
    EXPECT_TRUE(same_tensor(pg.all_reduce(i), reference_reduce(ints, ReduceOp::sum)));
    EXPECT_TRUE(same_tensor(pg.reduce_scatter(i, 1, ReduceOp::min),
                            raw::narrow(reference_reduce(ints, ReduceOp::min), 1, 2 * ctx.rank, 2)));
    std::vector<Tensor> pieces;
    for (const Tensor& s : ints) pieces.push_back(raw::narrow(s, 1, 2 * ctx.rank, 2));
    EXPECT_TRUE(same_tensor(pg.all_to_all(i, 1, 0), raw::cat(pieces, 0)));
    Tensor got = zeros({9}, {.dtype = DType::boolean});
    pg.batch_p2p({P2POp::send(f, (ctx.rank + 1) % n), P2POp::recv(got, (ctx.rank + n - 1) % n)});
    EXPECT_TRUE(same_tensor(got, flags[static_cast<size_t>((ctx.rank + n - 1) % n)]));
  });
}

TEST(AsyncTest, EmptyAndZeroDimTensors) {
  run_ranks(3, [](RankContext& ctx) {
    auto& pg = *ctx.world;
    EXPECT_EQ(pg.all_reduce(zeros({0, 4})).shape(), (Shape{0, 4}));
    EXPECT_EQ(pg.all_reduce(scalar_tensor(ctx.rank + 1.0)).item<float>(), 6.0f);
    EXPECT_EQ(pg.broadcast(scalar_tensor(ctx.rank, {.dtype = DType::i64}), 2).item<int64_t>(), 2);
    // Rank 0 contributes no rows.
    const Tensor gathered = pg.all_gather(full({ctx.rank, 2}, ctx.rank), 0);
    EXPECT_TRUE(same_tensor(gathered, from_vector<float>({1, 1, 2, 2, 2, 2}, {3, 2})));
    EXPECT_EQ(pg.reduce_scatter(ones({2, 3}), 0).shape(), (Shape{ctx.rank < 2 ? 1 : 0, 3}));
  });
}

TEST(AsyncTest, NanWinsInMaxAndMin) {
  run_ranks(2, [](RankContext& ctx) {
    const Tensor x = ctx.rank == 1 ? from_vector<float>({NAN, 1.0f}, {2}) : from_vector<float>({5.0f, NAN}, {2});
    for (ReduceOp op : {ReduceOp::max, ReduceOp::min}) {
      const auto v = ctx.world->all_reduce(x, op).to_vector<float>();
      EXPECT_TRUE(std::isnan(v[0]) && std::isnan(v[1])) << dist::reduce_op_name(op);
    }
  });
}

TEST(AsyncTest, GroupsRunConcurrentlyWithoutInterfering) {
  run_ranks(4, [](RankContext& ctx) {
    auto& pg = *ctx.world;
    auto low = pg.new_group({0, 1});
    auto high = pg.new_group({3, 2});  // ranks in the new group follow the list: global 3 is rank 0
    auto odd = pg.new_group({1, 3}, "odd");
    auto mine = ctx.rank < 2 ? low : high;
    ASSERT_NE(mine, nullptr);
    EXPECT_EQ(high == nullptr, ctx.rank < 2);
    if (ctx.rank >= 2) EXPECT_EQ(high->rank(), 3 - ctx.rank);
    EXPECT_EQ(low ? low->name() : "", ctx.rank < 2 ? "world[0,1]" : "");
    const Tensor x = full({4}, ctx.rank + 1);
    WorkPtr a = mine->all_reduce_async(x);
    WorkPtr w = pg.all_reduce_async(x);
    WorkPtr o = odd ? odd->all_gather_async(x, 0) : nullptr;
    EXPECT_TRUE(same_tensor(w->wait_tensor(), full({4}, 10)));
    EXPECT_TRUE(same_tensor(a->wait_tensor(), full({4}, ctx.rank < 2 ? 3 : 7)));
    if (o) EXPECT_TRUE(same_tensor(o->wait_tensor(), raw::cat({full({4}, 2), full({4}, 4)}, 0)));
    // A group of a group: global ranks are carried through.
    if (ctx.rank >= 2) {
      auto solo = high->new_group({1});  // high's rank 1 is global rank 2
      ASSERT_EQ(solo == nullptr, ctx.rank == 3);
      if (solo) {
        EXPECT_EQ(solo->global_ranks(), (std::vector<int>{2}));
        EXPECT_TRUE(same_tensor(solo->all_reduce(x), x));
      }
    } else {
      EXPECT_EQ(low->new_group({1}) == nullptr, ctx.rank == 0);
    }
  });
}

TEST(AsyncTest, MessagesWithTheSameTagArriveInOrderAndTagsAreSeparate) {
  run_ranks(2, [](RankContext& ctx) {
    auto& pg = *ctx.world;
    if (ctx.rank == 0) {
      pg.batch_p2p({P2POp::send(full({2}, 1), 1), P2POp::send(full({2}, 2), 1), P2POp::send(full({2}, 9), 1, 5),
                    P2POp::send(full({2}, 3), 1)});
    } else {
      Tensor a = zeros({2}), b = zeros({2}), c = zeros({2}), tagged = zeros({2});
      pg.recv(tagged, 0, 5);  // posted third, received first: tags are separate queues
      pg.batch_p2p({P2POp::recv(a, 0), P2POp::recv(b, 0), P2POp::recv(c, 0)});
      EXPECT_EQ(tagged.to_vector<float>()[0], 9.0f);
      EXPECT_EQ(a.to_vector<float>()[0], 1.0f);
      EXPECT_EQ(b.to_vector<float>()[0], 2.0f);
      EXPECT_EQ(c.to_vector<float>()[0], 3.0f);
    }
    // A rank may send to itself within one batch.
    Tensor self = zeros({3});
    pg.batch_p2p({P2POp::send(full({3}, ctx.rank), ctx.rank, 1), P2POp::recv(self, ctx.rank, 1)});
    EXPECT_TRUE(same_tensor(self, full({3}, ctx.rank)));
  });
}

TEST(AsyncTest, LargeTensorsSplitAcrossOpenMpThreads) {
  // Big enough for the parallel paths of the reduction (>= 2^18 elements per rank share) and of
  // contiguous copies (> 1 MiB), with sizes that do not divide evenly.
  const int n = 2;
  const Shape shape{3, 400'001};
  const auto xs = all_inputs(n, [&](int r) { return rank_tensor(shape, r); });
  const auto bf = all_inputs(n, [&](int r) { return rank_tensor(shape, r, DType::bf16); });
  dist::launch(
      n,
      [&](RankContext& ctx) {
        auto& pg = *ctx.world;
        const Tensor x = xs[static_cast<size_t>(ctx.rank)];
        EXPECT_TRUE(same_tensor(pg.all_reduce(x, ReduceOp::avg), reference_reduce(xs, ReduceOp::avg)));
        EXPECT_TRUE(same_tensor(pg.all_reduce(bf[static_cast<size_t>(ctx.rank)]), reference_reduce(bf, ReduceOp::sum)));
        EXPECT_TRUE(same_tensor(pg.reduce_scatter(x, 1, ReduceOp::max),
                                raw::narrow(reference_reduce(xs, ReduceOp::max), 1, ctx.rank == 0 ? 0 : 200'001,
                                            ctx.rank == 0 ? 200'001 : 200'000)));
        EXPECT_TRUE(same_tensor(pg.all_gather(x, 0), raw::cat(xs, 0)));
      },
      {.devices = dist::DevicePolicy::cpu, .omp_threads_per_rank = 2});
}

}  // namespace
}  // namespace cpf::testing
