// Deferred launches of NcclProcessGroup (NcclRankState::run_deferred): an operation's post returns
// while NCCL's thread may still be launching it, and its completion event is recorded later. These
// tests post faster than the launches finish and check that callers see no difference: values after
// wait() or after dropping the Work, operations of the immediate path right after a deferred one on
// the same communicator, and aborts or timeouts while a launch is pending.
#include <atomic>
#include <chrono>
#include <thread>

#include "framework/distributed/nccl/nccl_direct.h"
#include "framework/tensor/ops/join.h"
#include "tests/distributed/nccl/bounded_wait.h"
#include "tests/distributed/nccl/nccl_test_utils.h"

namespace cpf::testing {
namespace {

using dist::P2POp;
using namespace std::chrono_literals;

class NcclDeferredLaunch : public MultiGpuTest {};

TensorOptions bf16_on(const RankContext& ctx) { return {.dtype = DType::bf16, .device = ctx.device}; }

// What rank `r` sends in round `round` of iteration `it`: small integers, exact in bf16, whose sign
// flips with the iteration so a value left over from the previous iteration is caught.
double sent_value(int r, int round, int it) { return ((r + 1) * 8 + round) * (it % 2 == 0 ? 1.0 : -1.0); }

// How iteration `it` finishes its rounds' Works (posted back to back, all in flight): waited in
// reverse order; dropped (even rounds) or waited (odd ones); polled with is_completed() then dropped.
void finish_round(dist::WorkPtr& work, int it, int round) {
  switch (it % 3) {
    case 0: work->wait(); break;
    case 1:
      if (round % 2 == 1) work->wait();
      break;
    default: {
      const auto start = std::chrono::steady_clock::now();
      while (!work->is_completed()) ASSERT_LT(std::chrono::steady_clock::now() - start, 30s) << "round " << round;
    }
  }
  work.reset();  // a dropped Work orders the issuing (current) stream after its operation
}

TEST_F(NcclDeferredLaunch, BackToBackShiftsWaitedAndDroppedInMixedOrders) {
  constexpr int kRounds = 6;
  constexpr int64_t kElems = 1 << 18;
  for (const int n : world_sizes()) {
    run_nccl(n, [&](RankContext& ctx) {
      const int next = (ctx.rank + 1) % n, prev = (ctx.rank + n - 1) % n;
      std::vector<Tensor> sends, recvs;
      for (int r = 0; r < kRounds; ++r) {
        sends.push_back(empty({kElems}, bf16_on(ctx)));
        recvs.push_back(empty({kElems}, bf16_on(ctx)));
      }
      for (int it = 0; it < 24; ++it) {
        std::vector<dist::WorkPtr> works;
        for (int r = 0; r < kRounds; ++r) {
          // A kernel on the caller's stream writes the block just before its post (the post must order
          // the communication after it), overwriting what the previous iteration sent from there.
          raw::copy_(sends[r], full({kElems}, sent_value(ctx.rank, r, it), bf16_on(ctx)));
          works.push_back(ctx.world->batch_p2p_async({P2POp::send(sends[r], next), P2POp::recv(recvs[r], prev)}));
        }
        std::vector<Tensor> seen;  // read by kernels on the caller's stream once each round is finished
        for (int k = 0; k < kRounds; ++k) {
          const int r = it % 3 == 0 ? kRounds - 1 - k : k;
          finish_round(works[r], it, r);
          seen.push_back(raw::mul(recvs[r], 1.0));
        }
        const std::vector<float> got = raw::to(raw::cat(seen, 0), DType::f32).to_vector<float>();
        for (int k = 0; k < kRounds; ++k) {
          const int r = it % 3 == 0 ? kRounds - 1 - k : k;
          const float want = static_cast<float>(sent_value(prev, r, it));
          for (int64_t i = 0; i < kElems; i += kElems / 8) {
            ASSERT_EQ(got[static_cast<size_t>(k * kElems + i)], want)
                << "n=" << n << " rank " << ctx.rank << " iteration " << it << " round " << r;
          }
        }
      }
    });
  }
}

TEST_F(NcclDeferredLaunch, WorkDroppedWhileItsLaunchIsPendingOrdersTheStream) {
  for (const int n : world_sizes()) {
    run_nccl(n, [&](RankContext& ctx) {
      const int next = (ctx.rank + 1) % n, prev = (ctx.rank + n - 1) % n;
      Tensor mine = full({1 << 20}, ctx.rank + 1.0, bf16_on(ctx));
      for (int s = 1; s <= 200; ++s) {
        const Tensor in = empty({1 << 20}, bf16_on(ctx));
        // Dropped at once: the destructor finishes the launch and orders this stream after it.
        (void)ctx.world->batch_p2p_async({P2POp::send(raw::mul(mine, 1.0), next), P2POp::recv(in, prev)});
        mine = in;
        if (s % 25 == 0) {
          const int origin = ((ctx.rank - s) % n + n) % n;
          ASSERT_TRUE(matches(raw::to(mine, DType::f32), full({1 << 20}, origin + 1.0, {}), 0))
              << "n=" << n << " rank " << ctx.rank << " shift " << s;
        }
      }
    });
  }
}

// The immediate path (a copy-out, an exchange of sizes, the direct call, a host-blocking barrier)
// right after a deferred post on the same communicator: each finishes the pending launch first.
TEST_F(NcclDeferredLaunch, ImmediatePathRightAfterADeferredPost) {
  for (const int n : world_sizes()) {
    run_nccl(n, [&](RankContext& ctx) {
      const int next = (ctx.rank + 1) % n, prev = (ctx.rank + n - 1) % n;
      const auto f32 = TensorOptions{.device = ctx.device};
      for (int it = 0; it < 20; ++it) {
        const Tensor a_in = empty({4096}, f32);
        dist::WorkPtr deferred = ctx.world->batch_p2p_async(
            {P2POp::send(full({4096}, ctx.rank + 10.0 * it, f32), next), P2POp::recv(a_in, prev)});
        // A non-contiguous receive: staged, copied out after the NCCL calls (immediate path).
        const Tensor wide = zeros({4096, 2}, f32);
        const Tensor strided = raw::slice(wide, 1, 0, 1, 1);
        dist::WorkPtr staged = ctx.world->batch_p2p_async(
            {P2POp::send(full({4096, 1}, -ctx.rank - 1.0, f32), next), P2POp::recv(strided, prev)});
        // Unequal sizes: exchanged first (a collective the host waits for), then the gather.
        const Tensor gathered = ctx.world->all_gather(full({ctx.rank + 1}, ctx.rank, f32), 0);
        const Tensor direct_in = empty({16}, f32);
        dist::nccl::issue_direct_p2p(
            *ctx.world, {P2POp::send(full({16}, ctx.rank + 0.5, f32), next), P2POp::recv(direct_in, prev)});
        ctx.world->barrier();
        deferred->wait();
        staged->wait();
        const std::string where = "n=" + std::to_string(n) + " rank " + std::to_string(ctx.rank);
        ASSERT_TRUE(matches(a_in, full({4096}, prev + 10.0 * it, {}), 0)) << where << " iteration " << it;
        ASSERT_TRUE(matches(raw::contiguous(strided), full({4096, 1}, -prev - 1.0, {}), 0)) << where;
        ASSERT_TRUE(matches(direct_in, full({16}, prev + 0.5, {}), 0)) << where;
        std::vector<float> want;
        for (int r = 0; r < n; ++r) want.insert(want.end(), static_cast<size_t>(r + 1), static_cast<float>(r));
        ASSERT_EQ(gathered.to_vector<float>(), want) << where;
      }
    });
  }
}

TEST_F(NcclDeferredLaunch, AbortRightAfterADeferredPostFailsItsWaitWithTheReason) {
  within(60s, "an abort right after a deferred post", [] {
    EXPECT_CPF_ERROR(run_nccl(
                         2,
                         [](RankContext& ctx) {
                           const auto f32 = TensorOptions{.device = ctx.device};
                           const Tensor in = empty({1 << 16}, f32);
                           dist::WorkPtr work = ctx.world->batch_p2p_async(
                               {P2POp::send(ones({1 << 16}, f32), 1 - ctx.rank), P2POp::recv(in, 1 - ctx.rank)});
                           if (ctx.rank == 0) {
                             ctx.world->abort("stopped on purpose");  // drops the launch if still pending
                             EXPECT_TRUE(work->is_completed());
                             EXPECT_CPF_ERROR(work->wait(),
                                              "batch_p2p on group 'world': the NCCL world was aborted "
                                              "(rank 0 failed: stopped on purpose)");
                             work.reset();  // no throw from the destructor
                             return;
                           }
                           try {
                             work->wait();  // may pass before the abort
                           } catch (const std::exception&) {
                           }
                           // Rank 0 never comes to the barrier: only the abort ends it.
                           EXPECT_CPF_ERROR(ctx.world->barrier(), "rank 0 failed: stopped on purpose");
                         },
                         30s),
                     "rank 0 failed: stopped on purpose");
  });
}

// Rank 1 never posts: rank 0's shift is launched (or its launch stays pending) but never completes;
// the watchdog's timeout ages it even while its Work is held without a wait, and every wait then
// names it.
TEST_F(NcclDeferredLaunch, TimeoutOfAHeldDeferredPostNamesTheOperation) {
  std::atomic<bool> rank0_done{false};
  const auto start = std::chrono::steady_clock::now();
  within(60s, "a deferred post whose peer never comes", [&] {
    EXPECT_CPF_ERROR(run_nccl(
                         2,
                         [&](RankContext& ctx) {
                           if (ctx.rank == 1) {
                             while (!rank0_done.load()) std::this_thread::sleep_for(10ms);
                             return;
                           }
                           const auto f32 = TensorOptions{.device = ctx.device};
                           const Tensor in = empty({1 << 16}, f32);
                           dist::WorkPtr work =
                               ctx.world->batch_p2p_async({P2POp::send(ones({1 << 16}, f32), 1), P2POp::recv(in, 1)});
                           const auto held = std::chrono::steady_clock::now();
                           while (!work->is_completed()) {
                             if (std::chrono::steady_clock::now() - held > 20s) break;
                             std::this_thread::sleep_for(10ms);
                           }
                           rank0_done = true;
                           EXPECT_CPF_ERROR(work->wait(),
                                            "batch_p2p on group 'world' did not complete within the "
                                            "timeout of 2 s");
                           work->wait();  // throws again (the world is aborted): this rank fails the launch
                         },
                         2s),
                     "rank 0 failed: batch_p2p on group 'world' did not complete within the timeout of 2 s");
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 20.0) << "the 2 s timeout should end it";
}

}  // namespace
}  // namespace cpf::testing
