// The ring shift of a CP step (2 sends to rank + 1, 2 receives from rank - 1 in one batch) through
// the three paths nccl_post_bench compares: the group's batch_p2p_async, issue_direct_p2p on the
// group's communicator, and a BlockingCommunicator. Each shift passes blocks on around the ring, so
// after n shifts every rank holds its own again; hundreds of shifts reuse the pooled CUDA events of
// the group path (an event handed out again too early would let a wait pass before its data came).
#include "framework/distributed/nccl/nccl_direct.h"
#include "tests/distributed/nccl/nccl_test_utils.h"

namespace cpf::testing {
namespace {

using dist::P2POp;

class NcclDirect : public MultiGpuTest {};

// The blocks rank r starts with: K holds r + 1, V holds -(r + 1) (bf16-exact), `elems` each.
std::pair<Tensor, Tensor> own_blocks(const RankContext& ctx, int64_t elems) {
  const auto opts = TensorOptions{.dtype = DType::bf16, .device = ctx.device};
  return {full({elems}, ctx.rank + 1.0, opts), full({elems}, -(ctx.rank + 1.0), opts)};
}

// Shifts (k, v) `steps` times with `post` (which must leave the received blocks in k_in, v_in
// ordered before the caller's stream), checking after each that the blocks of rank - s arrived.
void shift_around(const RankContext& ctx, int steps, int64_t elems,
                  const std::function<void(const std::vector<P2POp>&, int step)>& post) {
  const int n = ctx.world_size, next = (ctx.rank + 1) % n, prev = (ctx.rank + n - 1) % n;
  auto [k, v] = own_blocks(ctx, elems);
  for (int s = 1; s <= steps; ++s) {
    const auto opts = TensorOptions{.dtype = DType::bf16, .device = ctx.device};
    Tensor k_in = empty({elems}, opts), v_in = empty({elems}, opts);
    // The blocks sent are written by a kernel on the caller's stream just before, and the ones received
    // are read by the next step's kernel there: an operation not ordered after the caller's stream, or a
    // wait not ordering the caller's stream after the operation, passes on wrong values.
    const Tensor k_out = raw::mul(k, 1.0), v_out = raw::mul(v, 1.0);
    post({P2POp::send(k_out, next, 0), P2POp::send(v_out, next, 1), P2POp::recv(k_in, prev, 0),
          P2POp::recv(v_in, prev, 1)},
         s);
    k = k_in;
    v = v_in;
    const int origin = ((ctx.rank - s) % n + n) % n;
    if (s % 25 == 0 || s == steps) {  // reading back synchronises: check every 25th shift and the last
      ASSERT_TRUE(matches(raw::to(k, DType::f32), full({elems}, origin + 1.0, {}), 0))
          << "rank " << ctx.rank << " shift " << s << ": K of rank " << origin;
      ASSERT_TRUE(matches(raw::to(v, DType::f32), full({elems}, -(origin + 1.0), {}), 0))
          << "rank " << ctx.rank << " shift " << s << ": V of rank " << origin;
    }
  }
}

TEST_F(NcclDirect, GroupShiftsReuseEventsCorrectly) {
  for (const int n : world_sizes()) {
    run_nccl(n, [&](RankContext& ctx) {
      dist::WorkPtr dropped;
      shift_around(ctx, 300, 1 << 20, [&](const std::vector<P2POp>& ops, int step) {
        dist::WorkPtr work = ctx.world->batch_p2p_async(ops);
        EXPECT_EQ(work->description(), "batch_p2p on group 'world'");
        // Every third Work is dropped without wait() (its destructor orders the stream instead),
        // one step late so its event is still watched when the next one is handed out. Meanwhile
        // is_completed() orders the reads: a device synchronisation would not, since the launch of
        // an operation whose Work is neither waited nor gone may still be pending (nccl_work.cuh).
        if (step % 3 == 0) {
          dropped = work;
          const auto start = std::chrono::steady_clock::now();
          while (!work->is_completed()) {
            ASSERT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30)) << "shift " << step;
          }
        } else {
          work->wait();
          dropped.reset();
        }
      });
    });
  }
}

TEST_F(NcclDirect, IssueDirectP2PShiftsTheRing) {
  for (const int n : world_sizes()) {
    run_nccl(n, [&](RankContext& ctx) {
      shift_around(ctx, 2 * n, 4096, [&](const std::vector<P2POp>& ops, int) {
        dist::nccl::issue_direct_p2p(*ctx.world, ops);  // on the current stream: ordered already
      });
    });
  }
}

TEST_F(NcclDirect, BlockingCommunicatorShiftsTheRing) {
  for (const int n : world_sizes()) {
    run_nccl(n, [&](RankContext& ctx) {
      dist::nccl::BlockingCommunicator blocking(*ctx.world);
      shift_around(ctx, 2 * n, 4096, [&](const std::vector<P2POp>& ops, int) { blocking.batch_p2p(ops); });
      cuda::synchronize(ctx.device.index);  // destroyed last: this rank issues nothing more
    });
  }
}

TEST_F(NcclDirect, DirectP2PRejectsWhatNcclCannotCheck) {
  run_nccl(2, [&](RankContext& ctx) {
    const auto opts = TensorOptions{.dtype = DType::f32, .device = ctx.device};
    const Tensor wide = zeros({4, 8}, opts);
    const Tensor strided = raw::slice(wide, 1, 0, 8, 2);
    EXPECT_CPF_ERROR(dist::nccl::issue_direct_p2p(*ctx.world, {P2POp::send(strided, 1 - ctx.rank)}),
                     "issue_direct_p2p on group 'world' (global ranks [0,1]): op 0 (send) has a non-contiguous tensor");
    EXPECT_CPF_ERROR(dist::nccl::issue_direct_p2p(*ctx.world, {P2POp::recv(zeros({4}, opts), 2)}),
                     "op 0 (recv) names peer 2, out of range for 2 ranks (expected 0..1)");
    EXPECT_CPF_ERROR(dist::nccl::issue_direct_p2p(*ctx.world, {P2POp::send(zeros({4}), 1 - ctx.rank)}),
                     "op 0 (send) is on cpu but the communicator runs on cuda:");
    EXPECT_CPF_ERROR(dist::nccl::issue_direct_p2p(*ctx.world, {P2POp::send(Tensor(), 1 - ctx.rank)}),
                     "op 0 (send) has an undefined tensor");
    ctx.world->barrier();  // nothing was posted: the world still works
  });
}

TEST(NcclDirectThreadGroup, RejectsAGroupOfAnotherBackend) {
  dist::launch(1, [](RankContext& ctx) {
    EXPECT_CPF_ERROR(dist::nccl::issue_direct_p2p(*ctx.world, {}),
                     "issue_direct_p2p: group 'world' (global ranks [0]) is a thread group, not an NCCL group");
    EXPECT_CPF_ERROR((void)dist::nccl::BlockingCommunicator(*ctx.world), "BlockingCommunicator: group 'world'");
  });
}

}  // namespace
}  // namespace cpf::testing
