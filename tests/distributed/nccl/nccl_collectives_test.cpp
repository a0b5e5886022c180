// Every collective of NcclProcessGroup against a serial CPU computation, on 2 GPUs and on all
// visible GPUs, in process (dist::launch with Backend::nccl). Failures name n, rank, dtype, layout.
// Also the bounded waits: world creation and new_group with a rank that never comes end in errors
// naming it, not in a hang.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "distributed/rank_errors.h"
#include "framework/tensor/ops/join.h"
#include "tests/distributed/nccl/bounded_wait.h"
#include "tests/distributed/nccl/nccl_test_utils.h"

namespace cpf::testing {
namespace {

using dist::P2POp;

std::string where(int n, int rank, const std::string& what) {
  return "n=" + std::to_string(n) + " rank " + std::to_string(rank) + ": " + what;
}

class NcclCollectives : public MultiGpuTest {};

TEST_F(NcclCollectives, AllReduceEveryDtypeOpAndLayout) {
  const std::vector<DType> dtypes{DType::f32, DType::bf16, DType::f64, DType::i32, DType::i64, DType::boolean};
  const std::vector<ReduceOp> ops{ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min};
  for (int n : world_sizes()) {
    run_nccl(n, [&](RankContext& ctx) {
      for (DType dtype : dtypes) {
        for (ReduceOp op : ops) {
          if (dtype == DType::boolean && (op == ReduceOp::sum || op == ReduceOp::avg)) continue;
          if (!is_floating(dtype) && op == ReduceOp::avg) continue;
          for (Layout layout : {Layout::contiguous, Layout::strided}) {
            const Shape shape{3, 37, 5};
            const auto inputs = all_inputs(n, [&](int r) { return make_input(shape, dtype, 100 + r); });
            const Tensor expected = reference_reduce(inputs, op);
            const Tensor x = on_device(inputs[ctx.rank], ctx.device, layout);
            const std::string what =
                where(n, ctx.rank, str_cat("all_reduce ", reduce_op_name(op), " ", dtype, " ", layout_name(layout)));
            EXPECT_TRUE(matches(ctx.world->all_reduce(x, op), expected, reduce_tolerance(dtype, op))) << what;
            // In place, into the (possibly strided) input itself.
            ctx.world->all_reduce_(x, op);
            EXPECT_TRUE(matches(x, expected, reduce_tolerance(dtype, op))) << what << " (in place)";
          }
        }
      }
    });
  }
}

TEST_F(NcclCollectives, AllReduceLargeBf16AndEmpty) {
  for (int n : world_sizes()) {
    run_nccl(n, [&](RankContext& ctx) {
      const Shape shape{1 << 20};
      const auto inputs = all_inputs(n, [&](int r) { return make_input(shape, DType::bf16, 7 + r); });
      EXPECT_TRUE(matches(ctx.world->all_reduce(on_device(inputs[ctx.rank], ctx.device)),
                          reference_reduce(inputs, ReduceOp::sum), 1.5e-2))
          << where(n, ctx.rank, "all_reduce bf16 1M elements");
      const Tensor empty_t = zeros({0, 4}, {.device = ctx.device});
      EXPECT_EQ(ctx.world->all_reduce(empty_t).shape(), (Shape{0, 4}));
    });
  }
}

TEST_F(NcclCollectives, BroadcastFromEveryRoot) {
  for (int n : world_sizes()) {
    run_nccl(n, [&](RankContext& ctx) {
      for (int root = 0; root < n; ++root) {
        for (DType dtype : {DType::f32, DType::bf16, DType::i64, DType::boolean}) {
          const Tensor mine = make_input({4, 9}, dtype, 300 + ctx.rank);
          const Tensor expected = make_input({4, 9}, dtype, 300 + root);
          const std::string what = where(n, ctx.rank, str_cat("broadcast root ", root, " ", dtype));
          EXPECT_TRUE(matches(ctx.world->broadcast(on_device(mine, ctx.device, Layout::strided), root), expected, 0))
              << what;
          const Tensor in_place = on_device(mine, ctx.device, Layout::strided);
          ctx.world->broadcast_(in_place, root);
          EXPECT_TRUE(matches(in_place, expected, 0)) << what << " (in place, strided)";
        }
      }
    });
  }
}

TEST_F(NcclCollectives, AllGatherEqualUnequalAlongEveryDim) {
  for (int n : world_sizes()) {
    run_nccl(n, [&](RankContext& ctx) {
      for (int64_t dim : {0, 1, 2}) {
        for (bool unequal : {false, true}) {
          for (Layout layout : {Layout::contiguous, Layout::strided}) {
            // (2, 4, 3) pieces; unequal: size 1, 3, 4, 5, ... along dim (no piece is total / n, see docs).
            auto piece_shape = [&](int r) {
              Shape s{2, 4, 3};
              if (unequal) s[static_cast<size_t>(dim)] = r == 0 ? 1 : r + 2;
              return s;
            };
            const auto inputs = all_inputs(n, [&](int r) { return make_input(piece_shape(r), DType::f32, 500 + r); });
            const Tensor expected = raw::cat(inputs, dim);
            const std::string what = where(
                n, ctx.rank, str_cat("all_gather dim ", dim, unequal ? " unequal " : " equal ", layout_name(layout)));
            const Tensor x = on_device(inputs[ctx.rank], ctx.device, layout);
            EXPECT_TRUE(matches(ctx.world->all_gather(x, dim), expected, 0)) << what;
            // With out given (strided out too).
            const Tensor out = on_device(zeros_like(expected), ctx.device, layout);
            ctx.world->all_gather_async(x, dim, out)->wait();
            EXPECT_TRUE(matches(out, expected, 0)) << what << " (into out)";
          }
        }
      }
      // bf16 and bool move unchanged.
      for (DType dtype : {DType::bf16, DType::boolean, DType::i32}) {
        const auto inputs = all_inputs(n, [&](int r) { return make_input({5, 2}, dtype, 550 + r); });
        EXPECT_TRUE(matches(ctx.world->all_gather(on_device(inputs[ctx.rank], ctx.device), 1), raw::cat(inputs, 1), 0))
            << where(n, ctx.rank, str_cat("all_gather ", dtype));
      }
    });
  }
}

TEST_F(NcclCollectives, ReduceScatterEvenUnevenSplitsAndOut) {
  for (int n : world_sizes()) {
    run_nccl(n, [&](RankContext& ctx) {
      for (int64_t dim : {0, 1}) {
        for (int64_t total : {int64_t(4 * n), int64_t(4 * n + 3)}) {
          for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
            for (DType dtype : {DType::f32, DType::bf16}) {
              Shape shape{3, 2};
              shape.insert(shape.begin() + dim, total);
              const auto inputs = all_inputs(n, [&](int r) { return make_input(shape, dtype, 700 + r); });
              const Tensor reduced = reference_reduce(inputs, op);
              const auto pieces = dist::even_splits(total, n);
              int64_t offset = 0;
              for (int r = 0; r < ctx.rank; ++r) offset += pieces[static_cast<size_t>(r)];
              const Tensor expected = raw::contiguous(raw::narrow(reduced, dim, offset, pieces[ctx.rank]));
              const std::string what =
                  where(n, ctx.rank,
                        str_cat("reduce_scatter dim ", dim, " total ", total, " ", reduce_op_name(op), " ", dtype));
              const Tensor x = on_device(inputs[ctx.rank], ctx.device, Layout::strided);
              EXPECT_TRUE(matches(ctx.world->reduce_scatter(x, dim, op), expected, reduce_tolerance(dtype, op)))
                  << what;
            }
          }
        }
      }
      // Explicit splits (one empty piece), and each rank's out deciding its piece size.
      std::vector<int64_t> splits(static_cast<size_t>(n), 2);
      splits[0] = 0;
      splits[static_cast<size_t>(n - 1)] = 5;
      int64_t total = 0, offset = 0;
      for (int r = 0; r < n; ++r) {
        if (r < ctx.rank) offset += splits[static_cast<size_t>(r)];
        total += splits[static_cast<size_t>(r)];
      }
      const auto inputs = all_inputs(n, [&](int r) { return make_input({2, total}, DType::f32, 800 + r); });
      const Tensor expected =
          raw::contiguous(raw::narrow(reference_reduce(inputs, ReduceOp::sum), 1, offset, splits[ctx.rank]));
      const Tensor x = on_device(inputs[ctx.rank], ctx.device);
      EXPECT_TRUE(matches(ctx.world->reduce_scatter(x, 1, ReduceOp::sum, splits), expected, 1e-6))
          << where(n, ctx.rank, "reduce_scatter with splits");
      const Tensor out = zeros({2, splits[ctx.rank]}, {.device = ctx.device});
      ctx.world->reduce_scatter_async(x, 1, ReduceOp::sum, out)->wait();
      EXPECT_TRUE(matches(out, expected, 1e-6)) << where(n, ctx.rank, "reduce_scatter with out sizes");
    });
  }
}

TEST_F(NcclCollectives, AllToAllSplitAndConcatDims) {
  for (int n : world_sizes()) {
    run_nccl(n, [&](RankContext& ctx) {
      // Ulysses: (B, S/P, H, D) -> (B, S, H/P, D) and back, plus the flat cases.
      const std::vector<std::pair<int64_t, int64_t>> dims{{2, 1}, {1, 2}, {0, 0}, {0, 3}, {2, 0}};
      for (auto [split, concat] : dims) {
        for (Layout layout : {Layout::contiguous, Layout::strided}) {
          for (DType dtype : {DType::bf16, DType::f32}) {
            const Shape shape{2 * n, 2 * n, 2 * n, 3};
            const auto inputs = all_inputs(n, [&](int r) { return make_input(shape, dtype, 900 + r); });
            const int64_t k = shape[static_cast<size_t>(split)] / n;
            std::vector<Tensor> received;
            for (int j = 0; j < n; ++j) received.push_back(raw::narrow(inputs[j], split, ctx.rank * k, k));
            const Tensor expected = raw::cat(received, concat);
            const std::string what =
                where(n, ctx.rank,
                      str_cat("all_to_all split ", split, " concat ", concat, " ", dtype, " ", layout_name(layout)));
            const Tensor x = on_device(inputs[ctx.rank], ctx.device, layout);
            EXPECT_TRUE(matches(ctx.world->all_to_all(x, split, concat), expected, 0)) << what;
            const Tensor out = on_device(zeros_like(expected), ctx.device, layout);
            ctx.world->all_to_all_async(x, split, concat, out)->wait();
            EXPECT_TRUE(matches(out, expected, 0)) << what << " (into out)";
          }
        }
      }
    });
  }
}

TEST_F(NcclCollectives, PointToPointRingAndPairs) {
  for (int n : world_sizes()) {
    run_nccl(n, [&](RankContext& ctx) {
      const int next = (ctx.rank + 1) % n, prev = (ctx.rank + n - 1) % n;
      // Ring shift of two tensors at once (K and V), receive buffers strided.
      const Tensor k = make_input({4, 6}, DType::bf16, 1000 + ctx.rank);
      const Tensor v = make_input({4, 6}, DType::f32, 1100 + ctx.rank);
      const Tensor k_in = on_device(zeros({4, 6}, {.dtype = DType::bf16}), ctx.device, Layout::strided);
      const Tensor v_in = zeros({4, 6}, {.device = ctx.device});
      auto received = ctx.world->batch_p2p({P2POp::send(on_device(k, ctx.device, Layout::strided), next),
                                            P2POp::send(on_device(v, ctx.device), next, 1), P2POp::recv(k_in, prev),
                                            P2POp::recv(v_in, prev, 1)});
      ASSERT_EQ(received.size(), 2u);
      EXPECT_TRUE(matches(received[0], make_input({4, 6}, DType::bf16, 1000 + prev), 0))
          << where(n, ctx.rank, "ring K");
      EXPECT_TRUE(matches(v_in, make_input({4, 6}, DType::f32, 1100 + prev), 0)) << where(n, ctx.rank, "ring V");
      // Pairs: even ranks send to the next odd rank.
      if (ctx.rank % 2 == 0 && ctx.rank + 1 < n) {
        ctx.world->send(on_device(make_input({7}, DType::i64, 1200 + ctx.rank), ctx.device), ctx.rank + 1, 3);
      } else if (ctx.rank % 2 == 1) {
        const Tensor got = zeros({7}, {.dtype = DType::i64, .device = ctx.device});
        ctx.world->recv(got, ctx.rank - 1, 3);
        EXPECT_TRUE(matches(got, make_input({7}, DType::i64, 1200 + ctx.rank - 1), 0)) << where(n, ctx.rank, "pair");
      }
    });
  }
}

TEST_F(NcclCollectives, BarrierAndSubGroups) {
  for (int n : world_sizes()) {
    run_nccl(n, [&](RankContext& ctx) {
      ctx.world->barrier();
      // Even and odd ranks; every rank calls new_group for both (collective over the world).
      std::vector<int> evens, odds;
      for (int r = 0; r < n; ++r) (r % 2 == 0 ? evens : odds).push_back(r);
      auto even_group = ctx.world->new_group(evens, "even");
      auto odd_group = ctx.world->new_group(odds, "odd");
      auto& mine = ctx.rank % 2 == 0 ? even_group : odd_group;
      const auto& members = ctx.rank % 2 == 0 ? evens : odds;
      ASSERT_TRUE(mine) << where(n, ctx.rank, "member got no group");
      EXPECT_FALSE(ctx.rank % 2 == 0 ? odd_group : even_group) << where(n, ctx.rank, "non-member got a group");
      EXPECT_EQ(mine->size(), static_cast<int>(members.size()));
      EXPECT_EQ(mine->global_rank(), ctx.rank);
      EXPECT_EQ(mine->backend(), "nccl");
      std::vector<Tensor> inputs;
      for (int g : members) inputs.push_back(make_input({10}, DType::f32, 1300 + g));
      const Tensor x = on_device(make_input({10}, DType::f32, 1300 + ctx.rank), ctx.device);
      EXPECT_TRUE(matches(mine->all_reduce(x), reference_reduce(inputs, ReduceOp::sum), 1e-6))
          << where(n, ctx.rank, "sub-group all_reduce");
      // Reversed order: group rank i is world rank n-1-i.
      std::vector<int> reversed;
      for (int r = n - 1; r >= 0; --r) reversed.push_back(r);
      auto rev = ctx.world->new_group(reversed, "reversed");
      ASSERT_TRUE(rev);
      EXPECT_EQ(rev->rank(), n - 1 - ctx.rank);
      const Tensor gathered = rev->all_gather(on_device(full({1}, ctx.rank, {.dtype = DType::i32}), ctx.device));
      std::vector<int32_t> expect_order;
      for (int r = n - 1; r >= 0; --r) expect_order.push_back(r);
      EXPECT_EQ(gathered.to_vector<int32_t>(), expect_order) << where(n, ctx.rank, "reversed group order");
      // Sub-groups of sub-groups.
      if (members.size() >= 2) {
        auto pair = mine->new_group({1, 0});
        ASSERT_TRUE(pair);
        EXPECT_EQ(pair->size(), 2);
      } else {
        auto self = mine->new_group({0});
        ASSERT_TRUE(self);
        EXPECT_EQ(self->size(), 1);
        EXPECT_TRUE(matches(self->all_reduce(x), make_input({10}, DType::f32, 1300 + ctx.rank), 0)) << "group of one";
      }
      ctx.world->barrier();
    });
  }
}

TEST_F(NcclCollectives, AsyncWorkOverlapsWithCompute) {
  run_nccl(2, [&](RankContext& ctx) {
    const Tensor big = on_device(make_input({1 << 22}, DType::f32, 1400 + ctx.rank), ctx.device);
    dist::WorkPtr work = ctx.world->all_reduce_async(big, ReduceOp::sum);
    // Compute on the rank's own stream while the all_reduce runs on the communication stream.
    const Tensor other = raw::mul(on_device(make_input({1 << 20}, DType::f32, 3), ctx.device), 2.0);
    const Tensor sum = work->wait_tensor();
    const auto inputs = all_inputs(2, [&](int r) { return make_input({1 << 22}, DType::f32, 1400 + r); });
    EXPECT_TRUE(matches(sum, reference_reduce(inputs, ReduceOp::sum), 1e-6)) << where(2, ctx.rank, "async all_reduce");
    EXPECT_TRUE(matches(other, raw::mul(make_input({1 << 20}, DType::f32, 3), 2.0), 0)) << "compute beside it";
    cuda::synchronize(ctx.device.index);
    EXPECT_TRUE(work->is_completed());
    EXPECT_EQ(work->result().size(), 1u);
    EXPECT_NE(work->description().find("all_reduce on group 'world'"), std::string::npos) << work->description();
    // Several in flight at once, waited in reverse order.
    std::vector<dist::WorkPtr> works;
    std::vector<Tensor> xs;
    for (int i = 0; i < 8; ++i) {
      xs.push_back(on_device(full({1000}, ctx.rank + i, {}), ctx.device));
      works.push_back(ctx.world->all_reduce_async(xs.back()));
    }
    for (int i = 7; i >= 0; --i) {
      EXPECT_TRUE(matches(works[i]->wait_tensor(), full({1000}, 1 + 2 * i, {}), 0)) << "work " << i;
    }
  });
}

TEST_F(NcclCollectives, RankThatThrowsFailsTheOthersWithItsName) {
  const auto start = std::chrono::steady_clock::now();
  EXPECT_CPF_ERROR(run_nccl(
                       2,
                       [&](RankContext& ctx) {
                         if (ctx.rank == 1) throw std::runtime_error("boom on purpose");
                         // Rank 0 waits for a peer that never comes: the abort must release it.
                         const Tensor x = ones({1024}, {.device = ctx.device});
                         for (int i = 0; i < 3; ++i) {
                           Tensor y = ctx.world->all_reduce(x);
                           (void)y.to_vector<float>();
                         }
                       },
                       std::chrono::seconds(30)),
                   "rank 1 failed: boom on purpose");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 20.0) << "the other rank should leave at the abort, not at the 30 s timeout";
}

TEST_F(NcclCollectives, TimeoutAbortsWithAMessage) {
  // Rank 1 issues nothing and waits: rank 0's all_reduce cannot complete; the watchdog's timeout
  // (2 s) aborts the world and names the operation.
  std::atomic<bool> rank0_done{false};
  EXPECT_CPF_ERROR(run_nccl(
                       2,
                       [&](RankContext& ctx) {
                         if (ctx.rank == 1) {
                           while (!rank0_done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
                           return;
                         }
                         try {
                           const Tensor x = ones({16}, {.device = ctx.device});
                           Tensor y = ctx.world->all_reduce(x);
                           (void)y.to_vector<float>();
                           ctx.world->barrier();
                         } catch (...) {
                           rank0_done = true;
                           throw;
                         }
                         rank0_done = true;
                       },
                       std::chrono::seconds(2)),
                   "did not complete within the timeout");
}

// Backend::nccl for one test: the real in-process world (nccl::make_launch_world), except that rank
// 1's join() first runs `rank_one` (which throws, or waits). What each rank's join threw is kept;
// the real backend is registered again at the end.
class HookedNcclLaunch {
 public:
  explicit HookedNcclLaunch(std::function<void()> rank_one) : rank_one_(std::move(rank_one)) {
    dist::register_launch_backend(dist::Backend::nccl, [this](int n, const dist::LaunchOptions& options) {
      return std::unique_ptr<dist::LaunchWorld>(new World(dist::nccl::make_launch_world(n, options), this));
    });
  }
  ~HookedNcclLaunch() { dist::register_launch_backend(dist::Backend::nccl, dist::nccl::make_launch_world); }
  HookedNcclLaunch(const HookedNcclLaunch&) = delete;
  HookedNcclLaunch& operator=(const HookedNcclLaunch&) = delete;

  std::string error_of(int rank) {
    std::lock_guard lock(mutex_);
    return errors_[rank];
  }

 private:
  class World final : public dist::LaunchWorld {
   public:
    World(std::unique_ptr<dist::LaunchWorld> real, HookedNcclLaunch* hook) : real_(std::move(real)), hook_(hook) {}
    dist::ProcessGroupPtr join(int rank, Device device) override {
      if (rank == 1) hook_->rank_one_();
      try {
        return real_->join(rank, device);
      } catch (const std::exception& e) {
        std::lock_guard lock(hook_->mutex_);
        hook_->errors_[rank] = e.what();
        throw;
      }
    }
    void abort(int rank, const std::string& reason) override { real_->abort(rank, reason); }
    bool aborted() const override { return real_->aborted(); }
    std::string abort_reason() const override { return real_->abort_reason(); }

   private:
    std::unique_ptr<dist::LaunchWorld> real_;
    HookedNcclLaunch* hook_;
  };

  std::function<void()> rank_one_;
  std::mutex mutex_;
  std::map<int, std::string> errors_;
};

TEST_F(NcclCollectives, WorldCreationStopsWhenARankFailsBeforeItsCommunicator) {
  // Rank 1 throws before creating its communicator, half a second in, when rank 0 is waiting in its
  // (non-blocking) creation: rank 0 must leave at rank 1's abort with rank 1 named, not at the 30 s
  // timeout.
  HookedNcclLaunch hook([] {
    std::this_thread::sleep_for(500ms);
    throw std::runtime_error("rank 1 broke before creating its communicator (on purpose)");
  });
  const auto start = std::chrono::steady_clock::now();
  within(60s, "world creation after a rank failed", [&] {
    EXPECT_CPF_ERROR(run_nccl(
                         2, [](RankContext& ctx) { ADD_FAILURE() << "rank " << ctx.rank << " got a world"; }, 30s),
                     "rank 1 failed: rank 1 broke before creating its communicator");
  });
  EXPECT_LT(seconds_since(start), 20.0) << "rank 0 should leave at rank 1's abort, not at the 30 s timeout";
  const std::string rank0 = hook.error_of(0);
  EXPECT_NE(rank0.find("NCCL world creation (rank 0 of 2 on cuda:0) stopped"), std::string::npos) << rank0;
  EXPECT_NE(rank0.find("rank 1 failed: rank 1 broke"), std::string::npos) << rank0;
}

TEST_F(NcclCollectives, WorldCreationTimesOutWhenARankNeverComes) {
  // Rank 1's thread is held elsewhere and never starts its communicator: rank 0's creation ends at
  // the 2 s timeout, naming itself and rank 1. Rank 1 then gives up too.
  HookedNcclLaunch* self = nullptr;
  HookedNcclLaunch hook([&self] {
    const auto start = std::chrono::steady_clock::now();
    while (self->error_of(0).empty() && seconds_since(start) < 30.0) std::this_thread::sleep_for(10ms);
    throw std::runtime_error("rank 1 gave up after rank 0 failed");
  });
  self = &hook;
  const auto start = std::chrono::steady_clock::now();
  within(60s, "world creation with a rank that never comes", [&] {
    EXPECT_CPF_ERROR(run_nccl(
                         2, [](RankContext& ctx) { ADD_FAILURE() << "rank " << ctx.rank << " got a world"; }, 2s),
                     "rank 0 failed: NCCL world creation (rank 0 of 2 on cuda:0) did not complete within the "
                     "timeout of 2 s: rank 1 of the launch never began creating its communicator");
  });
  EXPECT_LT(seconds_since(start), 20.0) << "the 2 s timeout should end it";
}

TEST_F(NcclCollectives, NewGroupThatAMemberNeverCallsTimesOutNamingTheGroup) {
  // Rank 0 splits the world, rank 1 never does: rank 0's wait for it ends at the 2 s timeout with
  // the parent group, the new group and the absent rank named; the abort releases rank 1.
  std::atomic<bool> rank0_done{false};
  std::string rank0_error;
  const auto start = std::chrono::steady_clock::now();
  within(60s, "new_group with a member that never calls it", [&] {
    EXPECT_CPF_ERROR(run_nccl(
                         2,
                         [&](RankContext& ctx) {
                           if (ctx.rank == 1) {
                             while (!rank0_done.load() && seconds_since(start) < 30.0)
                               std::this_thread::sleep_for(10ms);
                             return;
                           }
                           try {
                             (void)ctx.world->new_group({0}, "lonely");
                           } catch (const std::exception& e) {
                             rank0_error = e.what();
                             rank0_done = true;
                             throw;
                           }
                           rank0_done = true;
                         },
                         2s),
                     "rank 0 failed: new_group on group 'world': rank 1 (global 1) did not arrive at new_group #1 "
                     "on this group (before ncclCommSplit into 'lonely') within the timeout of 2 s");
  });
  EXPECT_LT(seconds_since(start), 20.0) << "the 2 s timeout should end it";
  EXPECT_NE(rank0_error.find("must call new_group"), std::string::npos) << rank0_error;
}

TEST_F(NcclCollectives, RejectsWhatItCannotRun) {
  run_nccl(2, [&](RankContext& ctx) {
    EXPECT_CPF_ERROR(ctx.world->all_reduce(ones({4})), "is on cpu but this NCCL group runs on cuda:");
    const Device other = Device::cuda(1 - ctx.rank);
    EXPECT_CPF_ERROR(ctx.world->broadcast(ones({4}, {.device = other}), 0), "move it there first");
    ctx.world->barrier();
  });
  EXPECT_CPF_ERROR(run_nccl(cuda::device_count() + 1, [](RankContext&) {}), "GPUs but");
  EXPECT_CPF_ERROR(
      dist::launch(2, [](RankContext&) {}, {.devices = dist::DevicePolicy::cpu, .backend = dist::Backend::nccl}),
      "DevicePolicy::cpu is not possible");
  // Blocking communicators would put NCCL's waits out of the timeouts' reach.
  ::setenv("NCCL_COMM_BLOCKING", "1", 1);
  EXPECT_CPF_ERROR(run_nccl(2, [](RankContext&) {}), "NCCL_COMM_BLOCKING=1 makes NCCL calls block");
  ::unsetenv("NCCL_COMM_BLOCKING");
}

}  // namespace
}  // namespace cpf::testing
